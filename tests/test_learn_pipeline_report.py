"""benchmarks/learn_pipeline.py's report: each "within 0.02 of the specialist" check prints the standard error of the
difference from the samples behind the two held-out scores, so a reader sees whether the evaluation can resolve it."""

import json
from argparse import Namespace
from pathlib import Path

import pytest
from script_module import load_script


def _load():
    return load_script(Path("benchmarks/learn_pipeline.py"))


def _write(path: Path, rows: list[dict]) -> None:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_report_gives_the_standard_error_of_each_difference(tmp_path):
    lp = _load()
    assert lp.difference_se(0.75, 12, 0.583, 12) == pytest.approx(0.1894, abs=1e-4)
    assert lp.difference_se(0.5, 10_000, 0.5, 10_000) == pytest.approx(0.00707, abs=1e-5)
    ev = lambda step, d, p, prompts: {"step": step, f"eval/{d}/pass@1": p, f"eval/{d}/prompts": prompts, "eval/k": 4}  # noqa: E731
    _write(tmp_path / "pipeline" / "specialists" / "math", [ev(25, "math", 0.441, 64)])
    _write(tmp_path / "pipeline" / "specialists" / "agent", [ev(25, "agent", 0.75, 3)])
    _write(tmp_path / "pipeline" / "mixed_rl", [{**ev(0, "math", 0.512, 64), **ev(0, "agent", 0.75, 3)},
                                                {**ev(15, "math", 0.477, 64), **ev(15, "agent", 0.583, 3)}])
    text = lp.report(Namespace(out=tmp_path, plot=None, readme=False))
    assert ("ends -0.167 from the specialist (target within 0.02; the runs' own evaluations; standard error of that "
            "difference 0.189, on 12 and 12") in text
    assert ("ends +0.036 from the specialist (target within 0.02; the runs' own evaluations; standard error of that "
            "difference 0.044, on 256 and 256") in text


def test_the_final_evaluations_are_eval_only_runs_of_the_compared_checkpoints_and_the_report_uses_them(tmp_path):
    """--final-eval-samples: each compared run's last checkpoint scored again with many samples a prompt
    (eval.only, a config the run accepts), and the report's check then uses those scores and their sample counts."""
    from launch.config import check_config, compose

    lp = _load()
    for parts in lp.FINAL_EVAL.values():
        if parts[-1] != "agent":  # the agent specialist left no checkpoint: skipped
            (tmp_path.joinpath(*parts) / "checkpoints" / "step_000025").mkdir(parents=True)
            (tmp_path.joinpath(*parts) / "checkpoints" / "step_000025" / "COMPLETE").write_text("")
    cmds = lp.final_eval_commands(tmp_path, 80)
    assert sorted(cmds) == ["math_specialist", "mixed_rl"]
    args = cmds["mixed_rl"][3:]
    assert f"model.path={tmp_path / 'pipeline' / 'mixed_rl' / 'checkpoints' / 'step_000025' / 'hf'}" in args
    cfg = compose(args[:1] + [a for a in args[1:] if not a.startswith(("run_dir=", "model.path="))])
    check_config(cfg)
    assert cfg["eval"]["only"] is True and cfg["eval"]["n_samples"] == 80

    ev = lambda step, d, p, prompts, k=4: {"step": step, f"eval/{d}/pass@1": p, f"eval/{d}/prompts": prompts, "eval/k": k}  # noqa: E731
    _write(tmp_path / "r" / "pipeline" / "specialists" / "math", [ev(25, "math", 0.441, 64)])
    _write(tmp_path / "r" / "pipeline" / "mixed_rl", [ev(0, "math", 0.512, 64), ev(15, "math", 0.477, 64)])
    _write(tmp_path / "r" / "final_eval" / "math_specialist", [ev(25, "math", 0.45, 64, 80)])
    _write(tmp_path / "r" / "final_eval" / "mixed_rl", [ev(15, "math", 0.46, 64, 80)])
    text = lp.report(Namespace(out=tmp_path / "r", plot=None, readme=False))
    assert "SFT student / specialist = 1.16" in text  # the in-run scores, both at k=4
    assert "ends +0.010 from the specialist (target within 0.02; evaluated again: 0.450 and 0.460; standard error of " \
           "that difference 0.010, on 5120 and 5120 held-out samples)" in text


def test_pipeline_only_runs_the_pipeline_and_its_final_evaluations_on_one_gpu(tmp_path, monkeypatch):
    """--pipeline-only: the pipeline alone on --gpu (no mixed RL from the base, no distillation), then the final
    evaluations there too, one at a time."""
    lp = _load()
    started = []

    class Done:
        def wait(self, *a):
            return 0

    monkeypatch.setattr(lp, "_start", lambda cmd, gpu, log: started.append((cmd, gpu)) or Done())
    for parts in lp.FINAL_EVAL.values():  # each compared run left a complete checkpoint
        (tmp_path.joinpath(*parts) / "checkpoints").mkdir(parents=True)
    monkeypatch.setattr(lp, "complete_checkpoints", lambda d: [d / "checkpoints" / "step_5"])
    lp.orchestrate(tmp_path, opd_steps=20, gpu=1, final_samples_per_prompt=80, pipeline_only=True)
    assert [gpu for _, gpu in started] == [1, 1, 1, 1]
    assert "launch.pipeline" in started[0][0]
    rest = [" ".join(cmd) for cmd, _ in started[1:]]
    assert all("eval.only=true" in c and "eval.n_samples=80" in c for c in rest)
    assert not any("base_mixed" in c or "objective=distill" in c for c in rest)
    assert json.loads((tmp_path / "timing.json").read_text())["pipeline_rc"] == 0
    assert (tmp_path / "DONE").exists()
