"""rollout/vllm_model_info.py: the driver fills vLLM's model-class cache while the run starts, so that its vLLM
instances read the answer instead of each starting a Python process to work it out; a prewarm that fails costs the
run nothing."""

import json
import subprocess
import sys
import time

import pytest

from launch.loop import start_prewarm
from launch.startup import StartupTimeline
from rollout.vllm_model_info import ModelInfoPrewarm, architectures


def test_architectures_come_from_the_models_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM", 3]}))
    assert architectures(tmp_path) == ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text("{not json")
    assert architectures(tmp_path) == []
    assert architectures(tmp_path / "missing") == [] and architectures("Qwen/Qwen3-0.6B") == []


def test_a_prewarm_that_cannot_import_vllm_ends_and_the_run_goes_on(tmp_path, monkeypatch):
    """A broken vLLM install: the process fails at its import, `wait` answers None at once, nothing is marked,
    and sending the model's folder to the ended process raises nothing."""
    broken = tmp_path / "site" / "vllm"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this vLLM is broken')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    done = []
    prewarm = ModelInfoPrewarm(done.append)
    assert prewarm.wait(timeout=60) is None and prewarm.proc.returncode != 0
    prewarm.send(tmp_path)
    prewarm.stop()
    assert done == []


def test_a_prewarm_is_stopped_without_waiting_for_a_model(tmp_path, monkeypatch):
    """A run that fails before its model is found: `stop` ends the process waiting on its stdin within seconds."""
    site = tmp_path / "site" / "vllm"
    (site / "model_executor" / "models").mkdir(parents=True)
    (site / "__init__.py").write_text("")
    (site / "plugins.py").write_text("def load_general_plugins():\n    pass\n")
    (site / "model_executor" / "__init__.py").write_text("")
    (site / "model_executor" / "models" / "__init__.py").write_text("registry = None\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    prewarm = ModelInfoPrewarm()
    time.sleep(1.0)  # the import is done and the process waits for the model's folder
    t0 = time.perf_counter()
    prewarm.stop()
    assert prewarm.proc.poll() is not None and time.perf_counter() - t0 < 5


@pytest.mark.parametrize("overrides, wanted", [
    ({}, True), ({"rollout": {"engine": "hf"}}, False), ({"rollout": {"engine": "vlm"}}, False),
    ({"algorithm": {"objective": "sft"}}, False),
    ({"algorithm": {"objective": "unknown"}}, False)])
def test_only_runs_with_vllm_rollouts_prewarm(monkeypatch, overrides, wanted):
    import rollout.vllm_model_info as info

    started = []
    monkeypatch.setattr(info, "installed", lambda spec: True)  # this machine may lack vLLM; the choice is the point
    monkeypatch.setattr("launch.loop.ModelInfoPrewarm", lambda on_done: started.append(on_done) or "prewarm")
    cfg = {"rollout": {"engine": "vllm", **overrides.get("rollout", {})},
           "algorithm": {"objective": "grpo", **overrides.get("algorithm", {})}}
    assert (start_prewarm(cfg, StartupTimeline(time.time())) == "prewarm") is wanted and len(started) == int(wanted)


@pytest.mark.gpu  # vLLM is installed on the GPU machines only (it needs no GPU here)
def test_vllm_reads_what_the_prewarm_wrote(smollm2_path, tmp_path, monkeypatch):
    """With an empty VLLM_CACHE_ROOT, the prewarm answers for SmolLM2's LlamaForCausalLM and marks the timeline;
    a fresh process's vLLM registry then answers from that cache without starting its helper process."""
    pytest.importorskip("vllm.model_executor.models.registry")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    timeline = StartupTimeline(time.time())
    prewarm = ModelInfoPrewarm(lambda _: timeline.mark("vllm_model_info"))
    prewarm.send(smollm2_path)
    result = prewarm.wait(timeout=300)
    assert result is not None and result["warmed"] == ["LlamaForCausalLM"], result
    assert "vllm_model_info" in timeline.ordered()
    assert list((tmp_path / "vllm" / "modelinfos").glob("*LlamaForCausalLM.json"))
    check = ("from vllm.model_executor.models import registry\n"
             "def asked_again(fn):\n    raise SystemExit('vLLM started its helper process: the cache was not read')\n"
             "registry._run_in_subprocess = asked_again\n"
             "info = registry.ModelRegistry.models['LlamaForCausalLM'].inspect_model_cls()\n"
             "assert info.is_text_generation_model and not info.supports_multimodal\n")
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_train_stops_the_prewarm_and_frees_the_run_dir_when_start_up_fails(tmp_path, monkeypatch):
    """launch.loop.train: a failure before the model is found (prepare), a run_dir that another run holds, and a
    failure after the run_dir is locked (the trainer config) each end the prewarm process once; the run_dir is left
    free for the next run, and the other run's lock is left alone."""
    import launch.loop as loop
    from rl.config import ConfigError
    from launch.run_dir import RunDirLock

    calls = []

    class Prewarm:  # what train() does with the prewarm is the point here, not the process (tests above)
        def send(self, model_dir):
            calls.append(("send", model_dir))

        def stop(self):
            calls.append("stop")

    monkeypatch.setattr(loop, "start_prewarm", lambda cfg, timeline: Prewarm())
    monkeypatch.setattr(loop, "prepare", lambda cfg: (_ for _ in ()).throw(ValueError("no such model")))
    cfg = {"run_dir": str(tmp_path / "run"), "trainer": {}}
    with pytest.raises(ValueError, match="no such model"):
        loop.train(cfg)
    assert calls == ["stop"] and not (tmp_path / "run").exists()  # nothing locked, nothing written

    calls.clear()
    monkeypatch.setattr(loop, "prepare", lambda cfg: str(tmp_path / "model"))
    other = RunDirLock(tmp_path / "run")  # another run holds the run_dir
    with pytest.raises(ConfigError, match="in use by another run"):
        loop.train(cfg)
    assert calls == [("send", str(tmp_path / "model")), "stop"]
    with pytest.raises(ConfigError):  # still held: the failed run did not take or drop the other's lock
        RunDirLock(tmp_path / "run")
    other.release()

    calls.clear()
    with pytest.raises(KeyError, match="total_steps"):
        loop.train(cfg)
    assert calls == [("send", str(tmp_path / "model")), "stop"]
    RunDirLock(tmp_path / "run").release()  # the failed run released its lock
