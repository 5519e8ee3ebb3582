"""Every command the README shows, checked as written (issue 34): the ones that run on a CPU are run, the GPU ones
are composed and checked the way a run checks its config at start (before Ray), and the ones CI itself runs (the
install and the test command) are named. A command added to the README without a place here fails the test, so the
README cannot drift from what runs.

Placeholders a reader replaces are filled in: IN.jsonl / OUT.jsonl (a small input is written), DOMAIN (the agent
domain), [ENV] (a bundled environment), <your math set> (the bundled math set).
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from launch.config import check_config, compose

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PLACEHOLDERS = {"DOMAIN": "agent", "[ENV]": "smoke", "<your math set>": "rl/bundled/math.jsonl",
                "<your model>": "embedded:tiny-moe"}

# Commands CI runs itself (.ci/run): the install and the test command.
RUN_BY_CI = {'pip install -e ".[test]"', 'pytest -m "not gpu"'}
# Commands for a GPU machine or a cluster: checked to parse (launch.train's overrides compose and pass the config
# checks; the others are named).
GPU_ONLY = {"pip install torch", 'pip install -e ".[gpu]"', 'pip install -e ".[flash]" --no-build-isolation',
            "ray start --head", "ray start --address=...", "pytest -m gpu", "python -m launch.train +experiment=smol_agent",
            "python -m launch.train +experiment=smol_math", "python -m launch.pipeline +experiment=smol_pipeline",
            # several nodes (tests/test_two_nodes.py runs launch.local_nodes on the CPU; the rest needs machines)
            "ray start --head --port=6379", "ray start --address=<head ip>:6379", "pip install -e .",
            "ray job submit --address=http://<head ip>:8265 --working-dir . --",
            "python -m launch.local_nodes --nodes 2 --gpus-per-node 1 -- COMMAND"}
# Run as written on this machine (slow ones are run by tests marked slow, see RUN_SLOW).
RUN_FAST = {"python -m launch.train +experiment=mixed_rl --cfg job --resolve", "python -m launch.check_env [ENV]",
            "python -m rl.metric_keys",
            "python -m launch.score IN.jsonl --out OUT.jsonl +experiment=mixed_rl", "python -m rl.models smollm2",
            "python -m launch.generate +experiment=mixed_rl generate.k=2 generate.max_prompts=2 generate.keep=all "
            "generate.out=generated"}
RUN_SLOW = {"python -m launch.train +experiment=mixed_rl",  # tests/conftest.py: quick_start_run
            "python -m launch.report RUN_DIR",  # tests/test_report.py, on quick_start_run's run_dir
            "python -m launch.filter_tasks DOMAIN --k 8 --out kept.jsonl +experiment=mixed_rl",
            "python -m launch.train +experiment=mixed_rl ++domains.agent.dataset.path=kept.jsonl",
            "python -m launch.sft +experiment=sft",  # tests/test_sft.py: test_launch_sft_learns_checkpoints_and_resumes...
            # tests/test_pipeline.py: test_the_pipeline_runs_skips_and_resumes (as written, plus run_dir=<tmp>)
            "python -m launch.pipeline +experiment=v32_pipeline"}
# launch.train with more overrides than the main job: composed and checked as a run checks them at start.
CONFIG_ONLY = {"python -m launch.train +experiment=mixed_rl domains.math.kl_coef=0.001 domains.code.opsm_delta=null",
               "python -m launch.train +experiment=sft",
               "python -m launch.train +experiment=mixed_rl algorithm.objective=distill "
               "++domains.math.teacher=embedded:tiny-dense"}
# Not commands to run: a tool named in passing, the names of other tools' commands.
NAMED_ONLY = {"python -m launch.score", "python -m launch.train", "python -m launch.generate", "wandb sync", "pip download --no-deps",
              "python -m launch.pipeline",
              "pip install torch==2.13.0",
              # ~45 min on 2 cores; tests/test_mutation_runner.py runs it on two mutants (marked slow)
              "python benchmarks/mutation_test.py"}


def readme_commands() -> list[str]:
    """Each command of the README: the lines of its ```bash blocks (comments dropped, continuations joined) and its
    inline `python/pip/pytest/ray/wandb ...` spans."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                found.append(re.sub(r"\s+", " ", line))
    found += re.findall(r"`((?:python|pip|pytest|ray|wandb) [^`]+)`", README)
    return found


CLUSTER_KEY = "python -m launch.train +experiment=mixed_rl ray.address=auto"
TENSOR_PARALLEL_KEY = "python -m launch.train +experiment=mixed_rl (tensor parallel 2, reference sharded)"
OFFLOAD_KEY = "python -m launch.train +experiment=mixed_rl (four GPUs, optimizer state in host memory)"


def _key(command: str) -> str:
    """The GPU cluster commands are long: each is known by what sets it apart."""
    if "ray.address=auto" in command:
        return CLUSTER_KEY
    if "trainer.offload_optimizer=cpu" in command:
        return OFFLOAD_KEY
    return TENSOR_PARALLEL_KEY if "rollout.tensor_parallel_size=2" in command else command


KNOWN = (RUN_BY_CI | GPU_ONLY | RUN_FAST | RUN_SLOW | CONFIG_ONLY | NAMED_ONLY
         | {CLUSTER_KEY, TENSOR_PARALLEL_KEY, OFFLOAD_KEY})


def test_every_readme_command_has_a_check():
    commands = {_key(c) for c in readme_commands()}
    assert commands - KNOWN == set(), "README commands with no check here: add each to one of the sets above"
    assert KNOWN - commands == set(), "checked commands the README no longer shows: remove them here"


def _filled(command: str) -> list[str]:
    for k, v in PLACEHOLDERS.items():
        command = command.replace(k, v)
    return shlex.split(command)


def _run(command: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    argv = _filled(command)
    assert argv[0] == "python"
    return subprocess.run([sys.executable, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _check_like_a_run(command: str) -> dict:
    """launch.train's overrides composed and every config check a run makes at start before it looks at the model
    (launch/config.py's check_config: keys, agent domains, values, rewards, GPU shares, objective, overlap)."""
    argv = _filled(command)
    assert argv[:3] == ["python", "-m", "launch.train"], command
    cfg = compose(argv[3:])
    cfg["logger"]["mode"] = "offline"  # online W&B needs a login here
    check_config(cfg)
    return cfg


@pytest.mark.parametrize("command", sorted(CONFIG_ONLY | {c for c in GPU_ONLY if c.startswith("python -m launch.train")}))
def test_launch_train_commands_pass_the_config_checks(command):
    _check_like_a_run(command)


def test_the_gpu_cluster_command_passes_the_config_checks():
    (command,) = [c for c in readme_commands() if "ray.address=auto" in c]
    cfg = _check_like_a_run(command)
    assert cfg["trainer"]["num_processes"] == 8 and cfg["rollout"]["engine"] == "vllm"


def test_the_tensor_parallel_command_passes_the_config_checks():
    (command,) = [c for c in readme_commands() if _key(c) == TENSOR_PARALLEL_KEY]
    cfg = _check_like_a_run(command)
    assert cfg["rollout"]["tensor_parallel_size"] == 2 and cfg["trainer"]["ref_placement"] == "sharded"


def test_the_offload_command_passes_the_config_checks():
    (command,) = [c for c in readme_commands() if _key(c) == OFFLOAD_KEY]
    cfg = _check_like_a_run(command)
    assert cfg["trainer"]["offload_optimizer"] == "cpu" and cfg["trainer"]["zero_stage"] == 3
    assert cfg["rollout"]["tensor_parallel_size"] == 4 and cfg["trainer"]["num_processes"] == 4


def test_cfg_job_prints_the_config_resolved(tmp_path):
    proc = _run("python -m launch.train +experiment=mixed_rl --cfg job --resolve", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "${" not in proc.stdout and re.search(r"^run_dir: outputs/\d{8}-\d{6}$", proc.stdout, re.M)


def test_the_metric_key_table_prints_as_written(tmp_path):
    proc = _run("python -m rl.metric_keys", tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("| key | has a value | meaning |"), proc.stderr[-2000:]


def test_check_env_runs_as_written(tmp_path):
    proc = _run("python -m launch.check_env [ENV]", tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_score_runs_as_written(tmp_path):
    rows = [{"domain": "logic", "prompt": "2+2?", "response": "Answer: 4", "answer": "4"},
            {"domain": "math", "prompt": "1+1?", "response": "\\boxed{3}", "answer": "2"}]
    (tmp_path / "IN.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = _run("python -m launch.score IN.jsonl --out OUT.jsonl +experiment=mixed_rl", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = [json.loads(x) for x in (tmp_path / "OUT.jsonl").read_text().splitlines()]
    assert out[0]["parts"]["exact_match"] == 1.0 and out[1]["parts"]["math"] == 0.0


def test_generate_runs_as_written(tmp_path):
    """Every domain of the embedded default (math in both modes), 2 prompts x 2 samples each, into rows that the SFT
    data path reads (tests/test_generate.py checks the rows themselves)."""
    from rl.models import load_tokenizer, resolve_model_path
    from rl.sft_data import ConversationDataset, load_conversations

    command = "python -m launch.generate +experiment=mixed_rl generate.k=2 generate.max_prompts=2 generate.keep=all " \
              "generate.out=generated"
    proc = _run(command, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "generated"
    assert (out / "COMPLETE").exists() and "math/thinking: 2 prompts, 4 samples, 4 kept" in proc.stderr
    rows = load_conversations({"path": str(out / "data.jsonl")})
    assert {json.loads(x)["domain"] for x in (out / "data.jsonl").read_text().splitlines()} == \
        {"math", "code", "logic", "general", "agent"}
    data = ConversationDataset(rows, load_tokenizer(resolve_model_path("embedded:tiny-moe")), seed=0, max_tokens=4096)
    assert all(data.sample(i, 0) is not None for i in range(len(rows)))


def test_the_real_model_is_prepared_as_written(tmp_path, smollm2_path):
    proc = _run("python -m rl.models smollm2", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == smollm2_path  # the fixture's conversion, found in the cache


@pytest.mark.slow
def test_filter_tasks_and_training_on_its_output_run_as_written(tmp_path):
    proc = _run("python -m launch.filter_tasks DOMAIN --k 8 --out kept.jsonl +experiment=mixed_rl", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pass@8" in proc.stderr and (tmp_path / "kept.jsonl").exists()
    kept = (tmp_path / "kept.jsonl").read_text().splitlines()
    if not kept:  # an untrained tiny policy may solve no task: train on every task of the environment instead
        tasks = ROOT / "rollout" / "envs" / "smoke" / "tasks.jsonl"
        (tmp_path / "kept.jsonl").write_text(tasks.read_text())
    proc = _run("python -m launch.train +experiment=mixed_rl ++domains.agent.dataset.path=kept.jsonl", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_config_tour_names_every_config_file():
    tour = README[README.index("## Config tour"):README.index("Per-domain settings live under")]
    for group in sorted(p for p in (ROOT / "conf").iterdir() if p.is_dir()):
        row = re.search(rf"^\| `{group.name}/` \|([^|]*)\|", tour, re.M)
        assert row, f"conf/{group.name}/ has no row in the config tour"
        for f in sorted(group.glob("*.yaml")):
            assert f"`{f.name}`" in row.group(1), f"conf/{group.name}/{f.name} is not in the config tour"
