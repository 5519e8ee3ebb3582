"""benchmarks/learn_real.py's report: runs of several seeds are averaged, each seed's last-10 reward is listed."""

import json
import tempfile
from pathlib import Path

from script_module import load_script


def _module():
    return load_script(Path("benchmarks/learn_real.py"))


def _ours(path: Path, rewards: list[float]) -> None:
    path.mkdir(parents=True)
    path.joinpath("metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "reward/mean": r, "time/step": 2.0, "rollout/kept_set_cut_frac": 0.0}) + "\n"
        for i, r in enumerate(rewards)))


def _trl(path: Path, rewards: list[float]) -> None:
    path.mkdir(parents=True)
    path.joinpath("steps.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "reward": r, "seconds": 3.0}) + "\n" for i, r in enumerate(rewards)))


def test_report_averages_seeds(tmp_path, capsys):
    mod = _module()
    _ours(tmp_path / "ours_p095_ksm-s2", [0.0] * 10 + [0.4] * 10)
    _ours(tmp_path / "ours_p095_ksm-s3", [0.0] * 10 + [0.6] * 10)
    _trl(tmp_path / "trl_p1", [0.1] * 10 + [0.3] * 10)
    (tmp_path / "ours_p1-sx").mkdir()  # not a seed: ignored
    runs = mod.load(tmp_path)
    assert list(runs) == ["ours_p095_ksm", "trl_p1"] and list(runs["ours_p095_ksm"]) == ["s2", "s3"]

    class Args:  # the plot needs matplotlib, which the test extra does not install
        out, plot, readme, note = str(tmp_path), None, False, ""

    mod.report(Args())
    table = capsys.readouterr().out.splitlines()
    ksm = next(line for line in table if line.startswith("| ours, top_p=0.95 + Keep"))
    assert "| s2, s3 | 20 | 0.000 | 0.500 (0.400, 0.600) |" in ksm
    trl = next(line for line in table if line.startswith("| TRL"))
    assert "| - | 20 | 0.100 | 0.300 |" in trl


def test_runs_sharing_a_gpu_split_the_micro_batch_memory(tmp_path):
    """--per-gpu N: each of our runs sizes its micro-batches to 0.75/N of the free memory; an explicit --extra wins
    (it comes later on the command line); one run per GPU keeps the config's share."""
    mod = _module()
    seen = []
    mod.run_ours = lambda name, out, steps, extra, env, seed=None: seen.append((seed, list(extra))) or 0

    def launch(per_gpu, extra):
        seen.clear()
        mod.launch(mod.argparse.Namespace(out=str(tmp_path), gpus=["0"], per_gpu=per_gpu, runs=["ours_p1"],
                                          seeds=[2, 3], steps=1, extra=extra, stagger=0.0))
        return sorted(seen)

    assert launch(2, []) == [(2, ["trainer.micro_batch_memory=0.375"]), (3, ["trainer.micro_batch_memory=0.375"])]
    assert launch(1, []) == [(2, []), (3, [])]
    assert launch(2, ["trainer.micro_batch_memory=0.5"])[0][1] == ["trainer.micro_batch_memory=0.375",
                                                                     "trainer.micro_batch_memory=0.5"]


def test_launch_drops_a_clean_runs_ray_folder_and_keeps_a_failed_ones(tmp_path, monkeypatch, capsys):
    """Each run gets its own Ray folder (benchmarks/run_env.py): removed after exit code 0, kept and named after a
    failure, so many runs do not pile session folders up in /tmp."""
    mod = _module()
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    folders = {}

    def fake_run(name, out, steps, extra, env, seed=None):  # a run that used Ray: its folder is written to
        folders[name] = Path(env["RAY_TMPDIR"])
        (folders[name] / "session_latest").mkdir()
        (out / f"{name}.log").write_text("the run's log\n")
        assert env["CUDA_VISIBLE_DEVICES"] == "0"
        return 0 if name == "ours_p1" else 1

    monkeypatch.setattr(mod, "run_ours", fake_run)
    args = mod.argparse.Namespace(out=str(tmp_path / "out"), gpus=["0"], per_gpu=1, seeds=None, stagger=0.0,
                              runs=["ours_p1", "ours_p095_ksm"], extra=[], steps=2)
    mod.launch(args)
    assert set(folders) == {"ours_p1", "ours_p095_ksm"}
    assert not folders["ours_p1"].exists()
    assert folders["ours_p095_ksm"].exists() and folders["ours_p095_ksm"].parent == tmp_path / "tmp"
    printed = capsys.readouterr().out
    assert f"Ray logs are kept in {folders['ours_p095_ksm']}" in printed and "ours_p095_ksm FAILED" in printed
