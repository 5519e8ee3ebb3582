"""benchmarks/verl_peer.py on the CPU: its dataset, its reward, its reading of verl's logs, and (with verl 0.9.1
installed; CI does not install it) its overrides against verl's own Hydra config and checks, and the log-prob fix
against verl's own function. The GPU run itself is benchmarks/README.md's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import verl_peer as vp  # noqa: E402


def test_dataset_has_verls_columns_and_every_bundled_prompt(tmp_path):
    import pyarrow.parquet as pq

    from rl.data import BUNDLED_DIR

    bundled = [json.loads(x) for x in (BUNDLED_DIR / "math.jsonl").read_text().splitlines() if x.strip()]
    n = vp.write_dataset(tmp_path / "math.parquet")
    rows = pq.read_table(tmp_path / "math.parquet").to_pylist()
    assert n == len(rows) == len(bundled)
    assert set(rows[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert [r["prompt"][1]["content"] for r in rows] == [b["question"] for b in bundled]
    assert [r["reward_model"]["ground_truth"] for r in rows] == [str(b["answer"]) for b in bundled]
    first = rows[0]
    assert first["prompt"][0] == {"role": "system", "content": "Solve the problem. Put the final answer in \\boxed{}."}
    assert first["prompt"][1]["role"] == "user"
    assert first["reward_model"]["style"] == "rule" and first["ability"] == "math"
    assert first["extra_info"]["index"] == 0
    # every benchmark's step takes its prompts from this set
    assert all(b["prompts"] <= n for b in vp.BENCHES.values())


def _score(solution: str, gold: str) -> float:
    # verl's reward loop calls it with keywords (experimental/reward_loop/reward_manager/naive.py)
    return vp.compute_score(data_source=vp.DATA_SOURCE, solution_str=solution, ground_truth=gold,
                            extra_info={"index": 0, "num_turns": None, "rollout_reward_scores": {}})


def test_reward_scores_right_and_wrong_boxed_answers():
    assert _score("69 + 24 = 93, so the answer is \\boxed{93}.", "93") == 1.0
    assert _score("69 + 24 = 94, so the answer is \\boxed{94}.", "93") == 0.0
    assert _score("I do not know.", "93") == 0.0  # no answer: a reason to score 0, not an error


def test_reward_runs_math_verify_outside_the_main_thread():
    """verl calls compute_score from an executor thread, where math-verify cannot arm its SIGALRM timeouts: an
    answer the fast check leaves to math-verify is then scored in a spawned process, with the same result."""
    answers = {}

    def score():
        answers["right"] = _score("The sum is \\boxed{90 + 3}.", "93")
        answers["wrong"] = _score("The sum is \\boxed{90 + 4}.", "93")

    assert _score("The sum is \\boxed{90 + 3}.", "93") == 1.0  # in the main thread: math-verify in this process
    t = threading.Thread(target=score)
    t.start()
    t.join(120)
    assert answers == {"right": 1.0, "wrong": 0.0}
    assert vp._POOL is not None  # math-verify ran in the spawned process


# a line of verl's console logger (verl/utils/logger/aggregate_logger.py, concat_dict_to_str: "step:N" then
# " - key:pprint.pformat(value)" for every number); numpy 2 scalars print as np.float64(...)
CONSOLE = ("step:3 - actor/entropy:np.float64(1.25) - critic/score/mean:0.375 - response_length/mean:181.5 - "
           "timing_s/gen:2.5 - timing_s/reward:0.0001 - timing_s/old_log_prob:np.float64(0.75) - timing_s/adv:0.01 - "
           "timing_s/update_actor:1.5 - timing_s/update_weights:0.5 - timing_s/step:5.25 - "
           "timing_per_token_ms/gen:0.05 - perf/total_num_tokens:61234 - training/epoch:0")


def test_timing_parser_reads_verls_console_line():
    step, metrics = vp.parse_console_line(CONSOLE)
    assert step == 3
    assert metrics["timing_s/step"] == 5.25 and metrics["timing_s/old_log_prob"] == 0.75
    assert metrics["actor/entropy"] == 1.25 and metrics["perf/total_num_tokens"] == 61234
    assert vp.parse_console_line("Training Progress:  50%|#####     | 3/6") is None


def test_report_from_console_log_and_file_logger(tmp_path):
    name = "verl_smol_defaults"
    (tmp_path / f"{name}.log").write_text("\n".join(["(TaskRunner pid=1) noise", CONSOLE.replace("step:3", "step:1"),
                                                     CONSOLE, CONSOLE.replace("step:3", "step:2")]) + "\n")
    (s,) = vp.report(tmp_path, ["smol"], ["defaults"])
    assert s["steps"] == 3 and s["s_step"] == 5.25 and s["phases"]["ref"] == 0.0 and s["phases"]["gen"] == 2.5
    assert json.loads((tmp_path / f"{name}.json").read_text())["s_step"] == 5.25
    # the file logger's JSON lines (verl/utils/tracking.py FileLogger) win over the console
    (tmp_path / name).mkdir()
    (tmp_path / name / "steps.jsonl").write_text("".join(
        json.dumps({"step": k, "data": {"timing_s/step": float(k), "timing_s/gen": 1.0}}) + "\n" for k in (1, 2, 3, 4)))
    (s,) = vp.report(tmp_path, ["smol"], ["defaults"])
    assert s["steps"] == 4 and s["s_step"] == 3.0 and s["phases"]["gen"] == 1.0
    assert "| smol | defaults | 3.00 |" in vp.table([s])


def test_stops_with_a_reason_below_13_cpus():
    with pytest.raises(SystemExit, match="fewer than 13"):
        vp.check_cpus(2)
    vp.check_cpus(16)


def _verl_config_dir() -> Path:
    pytest.importorskip("verl")
    return Path(importlib.util.find_spec("verl").submodule_search_locations[0]) / "trainer" / "config"


@pytest.mark.parametrize("bench", list(vp.BENCHES))
@pytest.mark.parametrize("setting", vp.SETTINGS)
@pytest.mark.parametrize("eval_every", [0, 5])
def test_overrides_compose_and_pass_verls_checks(bench, setting, eval_every, tmp_path):
    """Every override is a key of verl's ppo_trainer.yaml (Hydra refuses unknown ones), the result passes verl's own
    validate_config and builds its actor, rollout and algorithm dataclasses; with held-out validation too."""
    config_dir = _verl_config_dir()
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from verl.trainer.main_ppo import need_critic, need_reference_policy, validate_config
    from verl.utils.config import omega_conf_to_dataclass

    run_dir = tmp_path / f"verl_{bench}_{setting}"
    ov = vp.overrides(bench, setting, "/models/m", tmp_path / "math.parquet", run_dir, 6,
                      eval_data=tmp_path / "eval.parquet", eval_every=eval_every)
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose("ppo_trainer", overrides=ov + vp.hydra_overrides(run_dir), return_hydra_config=True)
    assert cfg.hydra.run.dir == str(run_dir / "hydra")
    with open_dict(cfg):
        del cfg["hydra"]
    b = vp.BENCHES[bench]
    assert cfg.data.train_batch_size == b["prompts"] and cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.data.max_response_length == b["max_new_tokens"]
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing == (setting == "defaults")
    assert cfg.algorithm.rollout_correction.bypass_mode == (setting == "best")
    assert cfg.reward.custom_reward_function.name == "compute_score"
    assert need_reference_policy(cfg) == (b["kl"] > 0) and not need_critic(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.loss_agg_mode == "seq-mean-token-mean" and actor.optim.lr == 2e-5
    assert omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout).calculate_log_probs
    assert omega_conf_to_dataclass(cfg.algorithm).adv_estimator == "grpo"
    assert cfg.trainer.test_freq == (eval_every or -1)
    if eval_every:
        val = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout.val_kwargs)
        assert val.n == 4 and val.do_sample and val.temperature == 1.0


def test_chunked_logprobs_match_verls_row_loop():
    """The same values and gradients as verl's `logprobs_from_logits_v2` (bf16 and fp32, (tokens, vocab) as the
    remove-padding path gives it, and (batch, seq, vocab)), with blocks smaller than the input."""
    _verl_config_dir()
    import torch

    from verl.utils import torch_functional as vf

    original = vf.logprobs_from_logits_v2
    assert original is not vp.logprobs_by_chunks  # this test's process has no fixes installed
    torch.manual_seed(0)
    for shape in ((37, 101), (3, 13, 101)):
        for dtype in (torch.bfloat16, torch.float32):
            logits = (torch.randn(*shape) * 4).to(dtype)
            labels = torch.randint(0, shape[-1], shape[:-1])
            a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
            want, got = original(a, labels), vp.logprobs_by_chunks(b, labels, chunk_elems=5 * 101)
            assert got.shape == want.shape and got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            (want * torch.arange(want.numel()).view(want.shape)).sum().backward()
            (got * torch.arange(got.numel()).view(got.shape)).sum().backward()
            torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0)


def test_fixes_apply_on_import_in_a_fresh_process():
    """worker_setup (the Ray workers' setup hook and the launcher's first call) patches verl's modules when they
    are first imported, and the names verl's other modules import from them afterwards."""
    _verl_config_dir()
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import verl_peer as vp; vp.worker_setup(); "
            "import verl.models.transformers.monkey_patch as mp; import verl.utils.torch_functional as tf; "
            "assert mp.is_trl_available() is False; assert tf.logprobs_from_logits_v2 is vp.logprobs_by_chunks; "
            "assert tf.logprobs_from_logits.__globals__['logprobs_from_logits_v2'] is vp.logprobs_by_chunks; "
            "import torch; x = torch.randn(4, 9).bfloat16(); y = torch.tensor([0, 1, 2, 8]); "
            "assert torch.equal(tf.logprobs_from_logits(x, y), vp.logprobs_by_chunks(x, y)); "
            "print('patched')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "patched" in done.stdout, done.stderr[-3000:]


def test_held_out_validation_is_what_ours_and_trl_evaluate(tmp_path):
    """--eval-every (time_to_reward.py): verl validates on the first 64 held-out prompts, 4 samples each at the
    training sampling (verl's default is one greedy answer), every N steps; without it nothing is validated."""
    import pyarrow.parquet as pq

    from rl.data import BUNDLED_DIR

    data, held, run = tmp_path / "math.parquet", tmp_path / "eval.parquet", tmp_path / "verl"
    base = vp.overrides("smol", "best", "/m", data, run, 6)
    ev = vp.overrides("smol", "best", "/m", data, run, 6, eval_data=held, eval_every=5)
    assert "trainer.test_freq=-1" in base and "trainer.val_before_train=false" in base
    v = "actor_rollout_ref.rollout.val_kwargs"
    assert {"trainer.test_freq=5", f"data.val_files={held}", f"{v}.n=4", f"{v}.do_sample=true", f"{v}.temperature=1.0",
            f"{v}.top_p=1.0", f"{v}.top_k=-1", "trainer.val_before_train=false"} <= set(ev)
    keys = [x.split("=", 1)[0] for x in ev]
    assert len(keys) == len(set(keys))  # each key once: the validation replaces the run's own
    assert set(ev) - set(base) <= {x for x in ev if x.startswith(("trainer.test_freq", "data.val_files", v))}
    assert vp.write_dataset(held, "eval/math.jsonl", limit=64, split="test") == 64
    rows = pq.read_table(held).to_pylist()
    bundled = [json.loads(x) for x in (BUNDLED_DIR / "eval" / "math.jsonl").read_text().splitlines() if x.strip()]
    assert [r["prompt"][1]["content"] for r in rows] == [b["question"] for b in bundled[:64]]
    assert {r["extra_info"]["split"] for r in rows} == {"test"}


def test_a_named_run_is_one_benchmark_and_one_setting(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "verl_peer.py"), "--out", str(tmp_path),
                           "--name", "verl"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--name names one run" in done.stderr


def test_a_clean_runs_ray_folder_is_dropped_and_a_failed_ones_kept(tmp_path, monkeypatch, capsys):
    """Each verl run has a Ray folder of its own (benchmarks/run_env.py): removed after exit code 0 and after a stop
    on purpose (time_to_reward.py's Ctrl-C at its target), kept and named after a failure or a timeout (its Ray
    logs), so repeated runs do not pile session folders up in /tmp."""
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    outcome, folders = iter([0, 1, subprocess.TimeoutExpired("verl", 1), KeyboardInterrupt()]), []

    def fake_run(cmd, env, **kwargs):  # a run that started Ray: its folder was written to
        folders.append(Path(env["RAY_TMPDIR"]))
        (folders[-1] / "session_latest").mkdir()
        result = next(outcome)
        if isinstance(result, BaseException):
            raise result
        return subprocess.CompletedProcess(cmd, result)

    monkeypatch.setattr(vp.subprocess, "run", fake_run)
    for name in ("clean", "failed", "timed_out"):
        vp.run_verl("smol", "best", "/m", tmp_path / "out", 2, 10.0, name=name)
    with pytest.raises(KeyboardInterrupt):
        vp.run_verl("smol", "best", "/m", tmp_path / "out", 2, 10.0, name="stopped")
    assert not folders[0].exists() and not folders[3].exists()
    assert folders[1].exists() and folders[2].exists() and folders[1].parent == tmp_path / "tmp"
    printed = capsys.readouterr().out
    assert f"Ray logs are kept in {folders[1]}" in printed and f"Ray logs are kept in {folders[2]}" in printed
