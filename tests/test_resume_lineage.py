"""Issue 68 item 4: a resume that falls back to an older checkpoint must not delete its own lineage.

`trainer.resume=auto` skips a newest checkpoint that is damaged or does not load and continues from an older one.
Before the fix the skipped checkpoint stayed in `checkpoints/` as the "newest", and pruning by name
(`trainer.keep_checkpoints`) then deleted every checkpoint the resumed run wrote until its step passed the skipped
one's: with keep_checkpoints=1 a crash in that window left only the checkpoint that does not load. Now a checkpoint
skipped in favour of an older one is moved aside, to `checkpoints/bad/` (or, when `trainer.resume` names an older
checkpoint explicitly, a whole newer one to `checkpoints/superseded/`), where pruning and later resumes never see it.

The loop here is `launch.loop.train` itself, as `python -m launch.train` runs it, with the cluster, Ray, the tracker
and the sample source replaced by small stand-ins (no model, no Ray: seconds on CPU); the checkpoints are real
folders written by `launch.checkpoint.save_checkpoint`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

import launch.loop as loop
from launch.checkpoint import complete_checkpoints, find_resume, save_checkpoint
from launch.config import compose


def _ckpt(run_dir: Path, step: int) -> Path:
    """A whole checkpoint, as save_checkpoint leaves it."""
    p = run_dir / "checkpoints" / f"step_{step:06d}"
    (p / "deepspeed").mkdir(parents=True)
    (p / "hf").mkdir()
    (p / "deepspeed" / "optim_states.pt").write_bytes(b"x" * 64)
    (p / "hf" / "model.safetensors").write_bytes(b"w" * 32)
    (p / "state.json").write_text(json.dumps({"step": step, "data": {"cursor": {"math": [0, step]}}}))
    sizes = {str(f.relative_to(p)): f.stat().st_size for f in sorted(p.rglob("*")) if f.is_file()}
    (p / "MANIFEST.json").write_text(json.dumps(sizes))
    (p / "COMPLETE").touch()
    return p


class _Cluster:
    """Stands in for launch.cluster.Cluster: loads and saves checkpoint folders; `unloadable` names fail to load
    (as a DeepSpeed version change or a same-size corruption would: the files pass the manifest check)."""

    unloadable: set[str] = set()
    loaded: list[str] = []

    def __init__(self, cfg, model_path, timeline, trainers=True):
        self.trainers = trainers
        type(self).loaded = []

    def load(self, path: str) -> None:
        type(self).loaded.append(Path(path).name)
        if Path(path).name in self.unloadable:
            raise RuntimeError("ray::PolicyTrainer.load() failed\nRuntimeError: optimizer state does not match")

    def sync_weights(self) -> None:
        pass

    def save(self, path: str, state: dict) -> None:
        p = Path(path)
        (p / "deepspeed").mkdir(parents=True)
        (p / "hf").mkdir()
        (p / "deepspeed" / "optim_states.pt").write_bytes(b"x" * 64)
        (p / "hf" / "model.safetensors").write_bytes(b"w" * 32)

    def submit_train(self, batches):
        return batches

    def train_results(self, submitted):
        return {}

    def trainer_device_name(self) -> str:
        return "cpu"

    def shutdown(self) -> None:
        pass


class _Source:
    """Stands in for the rollout source: its data position is the step it has reached."""

    domains = ["math"]

    def __init__(self):
        self.cursor = 0

    def state_dict(self):
        return {"cursor": {"math": [0, self.cursor]}}

    def load_state_dict(self, state):
        self.cursor = int(state["cursor"]["math"][1])

    def start(self, cluster, tracker, total):
        pass

    def take(self, step, times):
        self.cursor = step
        return SimpleNamespace(trajs=[], ref_trajs=[])

    def next_step_samples(self):
        return None

    def after_update(self, step, times):
        return {}

    def step_metrics(self, step, times):
        return {}

    def evaluate_now(self, step):
        pass


class _Tracker:
    def __init__(self, *args, **kwargs):
        pass

    def log(self, metrics):
        pass

    def close(self):
        return {}


class _Perf:
    def __init__(self, *args, **kwargs):
        pass

    def metrics(self, *args):
        return {}


@pytest.fixture
def run(monkeypatch):
    """run(run_dir, *overrides, unloadable=()) runs launch.loop.train on the stand-ins; returns the steps trained."""
    monkeypatch.setattr(loop, "prepare", lambda cfg: "model")
    monkeypatch.setattr(loop, "load_tokenizer", lambda path: None)
    monkeypatch.setattr(loop, "start_prewarm", lambda cfg, timeline: None)
    monkeypatch.setattr(loop, "start_ray", lambda *args: None)
    monkeypatch.setattr(loop, "Cluster", _Cluster)
    monkeypatch.setattr(loop, "Tracker", _Tracker)
    monkeypatch.setattr(loop, "PerfMeter", _Perf)
    monkeypatch.setattr(loop, "load_body_flops", lambda path: None)
    monkeypatch.setattr(loop, "resolve_peak_tflops", lambda *args: None)
    monkeypatch.setattr(loop, "trainer_metrics", lambda *args: {})
    monkeypatch.setattr(loop, "minibatches", lambda trajs, *args: [trajs])
    sources: list[_Source] = []

    def make_source(cfg, kind, tokenizer):
        sources.append(_Source())
        return sources[-1]

    monkeypatch.setattr(loop, "make_source", make_source)

    def go(run_dir: Path, *overrides: str, unloadable=()) -> _Source:
        _Cluster.unloadable = set(unloadable)
        cfg = compose(["+experiment=mixed_rl", f"run_dir={run_dir}", "logger.mode=disabled", *overrides])
        loop.train(cfg)
        return sources[-1]

    return go


def _names(run_dir: Path, sub: str = "") -> list[str]:
    d = run_dir / "checkpoints" / sub
    return sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []


def test_a_resume_that_falls_back_keeps_the_checkpoints_it_writes(tmp_path, run, caplog):
    """The issue's case: checkpoints at steps 2 and 4, step 4 fails to load, resume=auto, keep_checkpoints=1. The
    run resumes from 2 and writes 3: step 3 must exist. Before: step 3 was pruned as soon as it was written (step 4
    sorted after it and counted as the newest), leaving only step 4, which does not load."""
    _ckpt(tmp_path, 2)
    _ckpt(tmp_path, 4)
    with caplog.at_level(logging.WARNING):
        run(tmp_path, "trainer.resume=auto", "trainer.keep_checkpoints=1", "trainer.save_every=1",
            "trainer.total_steps=3", unloadable={"step_000004"})
    assert _Cluster.loaded == ["step_000004", "step_000002"]
    assert _names(tmp_path) == ["bad", "step_000003"], _names(tmp_path)
    # the checkpoint that did not load is kept (it may be repairable), out of the way, with the reason it was skipped
    assert _names(tmp_path, "bad") == ["step_000004"]
    reason = (tmp_path / "checkpoints" / "bad" / "step_000004" / "SET_ASIDE").read_text()
    assert "does not load" in reason and "optimizer state does not match" in reason and "step_000002" in reason
    assert "moved step_000004 to" in caplog.text and "bad" in caplog.text
    # a later resume=auto takes the lineage that was continued, never the checkpoint set aside
    assert find_resume("auto", tmp_path) == [tmp_path / "checkpoints" / "step_000003"]


def test_a_damaged_newest_checkpoint_is_set_aside_too(tmp_path, run):
    """A newest checkpoint that find_resume skips (a file shorter than its manifest says) is the same hazard: it
    was never a candidate, but it sorted after the resumed run's checkpoints all the same."""
    _ckpt(tmp_path, 2)
    newest = _ckpt(tmp_path, 4)
    (newest / "deepspeed" / "optim_states.pt").write_bytes(b"x" * 10)  # truncated
    run(tmp_path, "trainer.resume=auto", "trainer.keep_checkpoints=1", "trainer.save_every=1",
        "trainer.total_steps=3")
    assert _Cluster.loaded == ["step_000002"]
    assert _names(tmp_path) == ["bad", "step_000003"] and _names(tmp_path, "bad") == ["step_000004"]
    reason = (tmp_path / "checkpoints" / "bad" / "step_000004" / "SET_ASIDE").read_text()
    assert "optim_states.pt has 10 bytes, 64 were written" in reason


def test_resuming_the_newest_checkpoint_moves_nothing(tmp_path, run):
    """The ordinary resume: nothing is set aside, and pruning keeps the newest keep_checkpoints as before."""
    _ckpt(tmp_path, 2)
    _ckpt(tmp_path, 4)
    source = run(tmp_path, "trainer.resume=auto", "trainer.keep_checkpoints=2", "trainer.save_every=1",
                 "trainer.total_steps=6")
    assert _Cluster.loaded == ["step_000004"] and source.cursor == 6
    assert _names(tmp_path) == ["step_000005", "step_000006"]


def test_an_explicit_older_checkpoint_sets_the_newer_ones_aside(tmp_path, run):
    """trainer.resume=<path> to an older checkpoint of the same run (a deliberate roll-back): the newer, whole
    checkpoints belong to the abandoned lineage. Before: the resumed run's step 3 was pruned (step 4 sorted after
    it), and a crash then made resume=auto continue the abandoned lineage from step 4."""
    older = _ckpt(tmp_path, 2)
    _ckpt(tmp_path, 4)
    _ckpt(tmp_path, 5)
    run(tmp_path, f"trainer.resume={older}", "trainer.keep_checkpoints=1", "trainer.save_every=1",
        "trainer.total_steps=3")
    assert _Cluster.loaded == ["step_000002"]
    assert _names(tmp_path) == ["step_000003", "superseded"]
    assert _names(tmp_path, "superseded") == ["step_000004", "step_000005"]
    assert find_resume("auto", tmp_path) == [tmp_path / "checkpoints" / "step_000003"]


def test_eval_only_moves_no_checkpoint(tmp_path, run):
    """eval.only evaluates the checkpoint it resumes and writes none: it leaves the run's checkpoints where they are
    (tests/test_eval_only.py runs the real thing)."""
    older = _ckpt(tmp_path, 2)
    _ckpt(tmp_path, 4)
    run(tmp_path, f"trainer.resume={older}", "eval.only=true", "trainer.keep_checkpoints=1")
    assert _Cluster.loaded == ["step_000002"] and _names(tmp_path) == ["step_000002", "step_000004"]


def test_a_second_fallback_past_the_same_step_keeps_both_bad_checkpoints(tmp_path, run):
    """bad/ never overwrites: a second checkpoint of the same step set aside later gets a name of its own."""
    _ckpt(tmp_path, 2)
    _ckpt(tmp_path, 4)
    run(tmp_path, "trainer.resume=auto", "trainer.keep_checkpoints=0", "trainer.save_every=1",
        "trainer.total_steps=4", unloadable={"step_000004"})
    # the resumed run wrote steps 3 and 4; its step 4 fails to load too
    assert _names(tmp_path) == ["bad", "step_000002", "step_000003", "step_000004"]
    run(tmp_path, "trainer.resume=auto", "trainer.keep_checkpoints=0", "trainer.save_every=1",
        "trainer.total_steps=3", unloadable={"step_000004"})
    assert _names(tmp_path, "bad") == ["step_000004", "step_000004.1"]


def test_pruning_never_deletes_a_checkpoint_newer_than_the_one_written(tmp_path):
    """save_checkpoint's pruning counts only the checkpoints up to the step it just wrote, so a newer one left from
    another lineage (were it ever there) can neither push the new checkpoint out nor be pruned in its place."""
    _ckpt(tmp_path, 2)
    _ckpt(tmp_path, 4)
    save_checkpoint(_Cluster(None, None, None), {"step": 3, "data": {"cursor": {}}}, tmp_path, 3, keep=1)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_000003", "step_000004"]


def test_checkpoints_sort_by_step_number(tmp_path):
    """Past step 999999 the names are one digit longer: the order is by step, not by name."""
    for step in (999_999, 1_000_000, 12):
        _ckpt(tmp_path, step)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_000012", "step_999999", "step_1000000"]
