"""`python -m launch.pipeline +experiment=v32_pipeline` (issue 35): the stage command lines built from the config
(which overrides reach which stage, the `~domains` removal, the forwarding, the inputs from earlier stages), the
config refusals, skipping complete stages, a failing stage; and (slow) the README's command end to end on the
embedded CPU default: every stage run, then skipped on a rerun, then the mixed RL stage resumed from an older
checkpoint."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launch.config import check_config, compose
from launch.pipeline import (GENERATE_COMPLETE, STAGE_COMPLETE, STATE, Pipeline, check_pipeline_block, main, plan,
                             split_argv)
from launch.sft import with_sft

ROOT = Path(__file__).resolve().parents[1]
DOMAINS = ["math", "code", "logic", "general", "agent"]


def _plan(tmp_path, *argv, run_name="pipe"):
    """The stages of `python -m launch.pipeline +experiment=v32_pipeline *argv`, as the pipeline builds them."""
    own, forwarded = split_argv(["+experiment=v32_pipeline", *argv])
    p = compose(own)["pipeline"]
    exp_cfg = compose([f"+experiment={p['experiment']}", *forwarded])
    stages = plan(check_pipeline_block(p, list(exp_cfg["domains"])), exp_cfg, forwarded, tmp_path, run_name)
    return {s.name: s for s in stages}


def _fake_checkpoint(stage_dir: Path, step: int) -> Path:
    """A finished stage's checkpoint as launch.checkpoint finds it (its COMPLETE written last)."""
    ckpt = stage_dir / "checkpoints" / f"step_{step:06d}"
    (ckpt / "hf").mkdir(parents=True)
    (ckpt / "COMPLETE").touch()
    return ckpt / "hf"


def test_the_stages_and_their_command_lines(tmp_path):
    stages = _plan(tmp_path, "model.path=embedded:tiny-dense", "domains.code.kl_coef=0.5", "run_name=ignored",
                   "pipeline.specialists=[math,logic]", "algorithm.clip_eps_high=0.28")
    assert list(stages) == ["specialists/math", "specialists/logic", "generated", "sft", "mixed_rl"]
    math = stages["specialists/math"]
    assert math.module == "launch.train" and math.dir == tmp_path / "specialists" / "math"
    # the experiment, then the command line's overrides, then the stage's own, then what the pipeline fixes
    assert math.overrides[:4] == ["+experiment=mixed_rl", "model.path=embedded:tiny-dense", "domains.code.kl_coef=0.5",
                                  "algorithm.clip_eps_high=0.28"]
    own = compose(["+experiment=v32_pipeline"])["pipeline"]["specialist_overrides"]
    assert math.overrides[4:4 + len(own)] == own and "trainer.total_steps=2" in own
    assert math.overrides[4 + len(own):] == ["~domains.code", "~domains.logic", "~domains.general", "~domains.agent",
                                  "trainer.resume=auto", "trainer.save_last=true", f"run_dir={math.dir}", "run_name=pipe-specialist-math",
                                  "logger.group=pipe"]
    cfg = compose(math.args())
    assert list(cfg["domains"]) == ["math"] and cfg["model"]["path"] == "embedded:tiny-dense"
    assert cfg["trainer"]["total_steps"] == 2 and cfg["trainer"]["resume"] == "auto"
    assert cfg["run_dir"] == str(math.dir) and cfg["logger"]["group"] == "pipe"
    check_config(cfg)  # a specialist is a valid training run
    assert list(compose(stages["specialists/logic"].args())["domains"]) == ["logic"]

    gen = stages["generated"]
    assert gen.module == "launch.generate" and "generate.out=" + str(tmp_path / "generated") in gen.overrides
    assert [a for a in gen.overrides if a.startswith("~domains.")] == ["~domains.code", "~domains.general",
                                                                        "~domains.agent"]
    assert {k: str(v) for k, v in gen.inputs.items()} == {
        f"++generate.generators.{d}": str(tmp_path / "specialists" / d) for d in ("math", "logic")}
    for d in ("math", "logic"):
        _fake_checkpoint(tmp_path / "specialists" / d, 2)
    cfg = compose(gen.args())
    assert list(cfg["domains"]) == ["math", "logic"] and cfg["generate"]["out"] == str(tmp_path / "generated")
    assert cfg["generate"]["generators"] == {
        d: str(tmp_path / "specialists" / d / "checkpoints" / "step_000002" / "hf") for d in ("math", "logic")}
    assert cfg["generate"]["keep"] == "all" and cfg["model"]["path"] == "embedded:tiny-dense"

    sft = stages["sft"]
    # SFT has no domains, and RL's algorithm keys are unknown to its algorithm group
    assert sft.module == "launch.sft" and "domains.code.kl_coef=0.5" not in sft.overrides
    assert "algorithm.clip_eps_high=0.28" not in sft.overrides
    cfg = compose(with_sft(sft.args()))
    assert cfg["algorithm"]["objective"] == "sft" and cfg["model"]["path"] == "embedded:tiny-dense"  # the base
    assert cfg["algorithm"]["dataset"]["path"] == str(tmp_path / "generated" / "data.jsonl")
    assert cfg["run_name"] == "pipe-sft" and cfg["trainer"]["total_steps"] == 2
    check_config(cfg)

    rl = stages["mixed_rl"]
    with pytest.raises(Exception, match="no complete checkpoint"):  # the SFT stage has not run
        rl.args()
    _fake_checkpoint(tmp_path / "sft", 1)
    newest = _fake_checkpoint(tmp_path / "sft", 2)
    cfg = compose(rl.args())
    assert cfg["model"]["path"] == str(newest)  # the SFT checkpoint wins over the command line's model.path
    assert list(cfg["domains"]) == DOMAINS and cfg["domains"]["code"]["kl_coef"] == 0.5
    assert cfg["trainer"]["save_every"] == 1 and cfg["run_dir"] == str(tmp_path / "mixed_rl")


def test_the_pipelines_own_overrides_stay_with_it():
    own, forwarded = split_argv(["+experiment=v32_pipeline", "pipeline.stop_after=sft", "run_dir=/r", "run_name=n",
                                 "++pipeline.specialists=[math]", "rollout=vllm", "trainer.device=cuda",
                                 "~domains.general", "+trainer.foo=1"])
    assert own == ["+experiment=v32_pipeline", "pipeline.stop_after=sft", "run_dir=/r", "run_name=n",
                   "++pipeline.specialists=[math]"]
    assert forwarded == ["rollout=vllm", "trainer.device=cuda", "~domains.general", "+trainer.foo=1"]


def test_a_group_the_user_names_is_kept_and_stop_after_ends_the_plan(tmp_path):
    stages = _plan(tmp_path, "logger.group=mine", "pipeline.stop_after=generate")
    assert list(stages) == ["specialists/math", "specialists/agent", "generated"]
    for s in stages.values():
        assert "logger.group=mine" in s.overrides and not any(a.startswith("logger.group=pipe") for a in s.overrides)
    assert list(_plan(tmp_path, "pipeline.stop_after=specialists")) == ["specialists/math", "specialists/agent"]
    assert list(_plan(tmp_path, "pipeline.stop_after=sft"))[-1] == "sft"
    # a domain the command line removes is not removed twice (that would not compose)
    stages = _plan(tmp_path, "~domains.general")
    assert "~domains.general" not in stages["specialists/math"].overrides[2:]
    assert list(compose(stages["specialists/agent"].args())["domains"]) == ["agent"]
    # an experiment with a model of its own: the SFT stage trains that base too, not the SFT experiment's default
    stages = _plan(tmp_path, "pipeline.experiment=smol_math", "pipeline.specialists=[math]")
    base = compose(stages["specialists/math"].args())["model"]["path"]
    assert base != "embedded:tiny-moe" and compose(with_sft(stages["sft"].args()))["model"]["path"] == base


@pytest.mark.parametrize("argv, message", [
    (["pipeline.specialists=[math,nope]"], "pipeline.specialists: 'nope' is not a domain of +experiment=mixed_rl "
                                           "(its domains: math, code, logic, general, agent)"),
    (["pipeline.specialists=[]"], "pipeline.specialists: name at least one domain"),
    (["pipeline.specialists=[math,math]"], "a domain is named twice"),
    (["pipeline.stop_after=rl"], "pipeline.stop_after=rl: one of specialists, generate, sft or null (run all)"),
    (["+pipeline.stages=3"], "pipeline.stages: unknown key"),
    (["pipeline.rl_overrides=oops"], "pipeline.rl_overrides='oops': must be a list"),
    (["pipeline.experiment=nope"], "pipeline.experiment=nope with the command line's overrides: In 'train': "
                                   "Could not find 'experiment/nope'"),
    (["pipeline.specialist_overrides=['trainer.totl_steps=2']"],
     "stage specialists/math: trainer.totl_steps: unknown key"),
    (["pipeline.specialist_overrides=['trainer.total_steps=-1']"], "stage specialists/math: trainer.total_steps"),
    (["trainer.lr=[1"], "no viable alternative at input '[1'"),
    (["pipeline.generate_overrides=['generate.keep=most']"], "stage generated: generate.keep must be one of"),
    (["--cfg", "job"], "--cfg: launch.pipeline takes Hydra overrides only"),
])
def test_config_mistakes_are_one_line_and_exit_code_2(tmp_path, capsys, argv, message):
    code = main(["+experiment=v32_pipeline", f"run_dir={tmp_path / 'run'}", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("config error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_without_the_pipeline_experiment(capsys):
    assert main(["run_dir=/tmp/unused"]) == 2
    assert "no pipeline block in the config: pass +experiment=v32_pipeline" in capsys.readouterr().err


def test_complete_stages_are_skipped_and_the_run_name_is_kept(tmp_path, capsys):
    for name in ("specialists/math", "specialists/agent", "sft", "mixed_rl"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / STAGE_COMPLETE).write_text(json.dumps({"seconds": 12.0}))
    (tmp_path / "sft" / "metrics.jsonl").write_text('{"step": 1, "loss/sft": 7.5}\n{"step": 2, "loss/sft": 6.0}\n')
    (tmp_path / "mixed_rl" / "metrics.jsonl").write_text(
        '{"step": 1, "reward/math/mean": 0.1, "eval/math/pass@k": 0.25, "reward/code/mean": null}\n'
        '{"step": 2, "reward/math/mean": 0.2, "reward/code/mean": 0.5}\n')
    final = _fake_checkpoint(tmp_path / "mixed_rl", 2)
    gen = tmp_path / "generated"
    gen.mkdir()
    (gen / GENERATE_COMPLETE).touch()  # launch.generate's own mark counts
    kinds = [("math", "thinking"), ("math", "thinking"), ("agent", "non_thinking")]
    (gen / "data.jsonl").write_text("".join(json.dumps({"domain": d, "mode": m}) + "\n" for d, m in kinds))
    (tmp_path / STATE).write_text(json.dumps({"run_name": "first"}))
    pipeline = Pipeline(["+experiment=v32_pipeline", f"run_dir={tmp_path}"])
    assert pipeline.run_name == "first"  # the W&B group of the first run, not a new time stamp
    assert all("run_name=first-" in " ".join(s.overrides) for s in pipeline.stages)
    start = time.time()
    assert pipeline.run() == 0 and time.time() - start < 5
    out = capsys.readouterr().out
    for name in ("specialists/math", "specialists/agent", "generated", "sft", "mixed_rl"):
        assert f"{name}: complete, skipped" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = {r["stage"]: r for r in summary["stages"]}
    assert {r["status"] for r in rows.values()} == {"skipped"} and rows["sft"]["ran_seconds"] == 12.0
    assert rows["generated"]["metrics"] == {"rows": 3, "rows/agent/non_thinking": 1, "rows/math/thinking": 2}
    assert rows["sft"]["metrics"] == {"steps": 2, "loss/sft first": 7.5, "loss/sft last": 6.0}
    assert rows["mixed_rl"]["metrics"] == {"steps": 2, "eval/math/pass@k": 0.25, "reward/code/mean": 0.5}
    assert f"last model: {final}" in out
    # a run_name given on the command line wins
    assert Pipeline(["+experiment=v32_pipeline", f"run_dir={tmp_path}", "run_name=other"]).run_name == "other"


def test_a_failing_stage_stops_the_pipeline_with_its_exit_code(tmp_path):
    """A stage that fails at start (a model path that does not exist; the config itself is fine) ends the pipeline
    with the stage's exit code and one line naming it; nothing after it runs and it is not marked complete."""
    env = {**os.environ, "WANDB_MODE": "offline"}
    proc = subprocess.run([sys.executable, "-m", "launch.pipeline", "+experiment=v32_pipeline",
                           f"run_dir={tmp_path}", "model.path=/no/such/model", "pipeline.stop_after=specialists"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "config error: model.path=/no/such/model" in proc.stdout + proc.stderr  # the stage's own, streamed
    log = tmp_path / "logs" / "specialists-math.log"  # the refused run removed its run_dir, train.log with it
    assert f"[pipeline] stage specialists/math failed (exit 2); its log: {log}; rerun the same command with " \
           f"run_dir={tmp_path} to continue from there" in proc.stdout
    assert "config error: model.path=/no/such/model" in log.read_text()
    assert "specialists/agent:" not in proc.stdout
    assert not (tmp_path / "specialists" / "math" / STAGE_COMPLETE).exists()
    assert json.loads((tmp_path / "summary.json").read_text())["stages"][0]["status"] == "failed (exit 2)"


def _pipeline(run_dir: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """The README's command as written, with run_dir, from the repository root."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "launch.pipeline", "+experiment=v32_pipeline", f"run_dir={run_dir}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        logs = sorted(run_dir.rglob("*.log"), key=lambda f: f.stat().st_mtime)[-1:]
        tail = logs[0].read_text(errors="replace").splitlines()[-60:] if logs else ["(no log)"]
        pytest.fail(f"launch.pipeline exited {proc.returncode}\n--- stdout ---\n" + "\n".join(
            proc.stdout.splitlines()[-40:]) + "\n--- stderr ---\n" + "\n".join(proc.stderr.splitlines()[-60:])
            + f"\n--- {logs[0] if logs else ''} ---\n" + "\n".join(tail), pytrace=False)
    return proc


def _steps(stage_dir: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (stage_dir / "metrics.jsonl").read_text().splitlines()]


def _model_path(stage_dir: Path) -> str:
    return yaml.safe_load((stage_dir / "config.yaml").read_text())["model"]["path"]


@pytest.mark.slow
def test_the_pipeline_runs_skips_and_resumes(tmp_path):
    run = tmp_path / "run"
    proc = _pipeline(run)
    names = ["specialists/math", "specialists/agent", "generated", "sft", "mixed_rl"]
    for name in names:
        assert (run / name / STAGE_COMPLETE).exists(), name
    base = "embedded:tiny-moe"
    for d in ("math", "agent"):
        spec = run / "specialists" / d
        assert _steps(spec) == [1, 2] and _model_path(spec) == base
        assert set(json.loads((spec / "summary.json").read_text())["reward"]) == {"all", d}  # that domain alone
    rows = [json.loads(x) for x in (run / "generated" / "data.jsonl").read_text().splitlines()]
    assert rows and {r["domain"] for r in rows} <= {"math", "agent"} and all(r["messages"] for r in rows)
    assert {r["generator"] for r in rows} <= {str(run / "specialists" / d / "checkpoints" / "step_000002" / "hf")
                                              for d in ("math", "agent")}
    assert _steps(run / "sft") == [1, 2] and _model_path(run / "sft") == base  # SFT of the base
    sft_hf = run / "sft" / "checkpoints" / "step_000002" / "hf"
    assert (sft_hf / "tokenizer_config.json").exists()  # the checkpoint is a whole model folder
    assert _steps(run / "mixed_rl") == [1, 2] and _model_path(run / "mixed_rl") == str(sft_hf)
    summary = json.loads((run / "summary.json").read_text())
    assert [r["stage"] for r in summary["stages"]] == names and {r["status"] for r in summary["stages"]} == {"ran"}
    assert "pipeline done in" in proc.stdout and "loss/sft last" in proc.stdout
    group = json.loads((run / STATE).read_text())["run_name"]
    for name in ("specialists/math", "specialists/agent", "sft", "mixed_rl"):  # one W&B group, a run per stage
        cfg = yaml.safe_load((run / name / "config.yaml").read_text())
        stage = name.replace("specialists/", "specialist-")
        assert cfg["logger"]["group"] == group and cfg["run_name"] == f"{group}-{stage}"

    # the same command again: every stage is complete and skipped
    marks = {n: (run / n / STAGE_COMPLETE).stat().st_mtime for n in names}
    start = time.time()
    proc = _pipeline(run)
    assert time.time() - start < 30
    for name in names:
        assert f"{name}: complete, skipped" in proc.stdout
        assert (run / name / STAGE_COMPLETE).stat().st_mtime == marks[name]

    # the mixed RL stage cut off after its first checkpoint: it resumes from there, the rest stays skipped
    (run / "mixed_rl" / STAGE_COMPLETE).unlink()
    shutil.rmtree(run / "mixed_rl" / "checkpoints" / "step_000002")
    proc = _pipeline(run)
    assert "resumed from" in proc.stdout + proc.stderr and "at step 2" in proc.stdout + proc.stderr
    assert _steps(run / "mixed_rl") == [1, 2] and (run / "mixed_rl" / STAGE_COMPLETE).exists()
    assert (run / "mixed_rl" / "checkpoints" / "step_000002" / "COMPLETE").exists()
    for name in names[:-1]:
        assert f"{name}: complete, skipped" in proc.stdout
