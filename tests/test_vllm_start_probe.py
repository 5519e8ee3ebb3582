"""benchmarks/vllm_start.py: the main thread's stack sampled while an engine starts, read back per function. The
start itself needs vLLM on a GPU; here a stand-in module under a `vllm/` folder is sampled for real, in and out of
C (time.sleep lets go of the GIL, as a subprocess wait or a CUDA call does)."""

import importlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import vllm_start  # noqa: E402

ENGINE = """\
import time
def start():
    return profile()
def profile():
    return run()
def run():
    return capture()
def capture():
    return warm_up()
def warm_up():
    time.sleep(1.5)
def load():
    time.sleep(0.5)
"""


def test_stack_samples_are_summed_per_function_of_the_main_thread(tmp_path, monkeypatch):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "engine.py").write_text(ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.spec_from_file_location("standin_vllm_engine", tmp_path / "vllm" / "engine.py")
    engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine)
    t0 = time.perf_counter()
    with vllm_start.StackSampler(0.1) as sampler:
        engine.load()
        engine.start()
    seconds = time.perf_counter() - t0
    found = sampler.stacks
    assert 0.7 * seconds / 0.1 <= len(found) <= seconds / 0.1 + 1  # ~2 s at one sample per 0.1 s
    summary = vllm_start.where(found)
    inner = dict(summary["innermost"])
    assert set(inner) == {"vllm/engine.py:warm_up", "vllm/engine.py:load"}
    assert inner["vllm/engine.py:warm_up"] > 2 * inner["vllm/engine.py:load"]
    assert dict(summary["phase"]) == {"vllm/engine.py:warm_up": inner["vllm/engine.py:warm_up"]}
    chains = dict(summary["stacks"])
    assert chains["vllm/engine.py:start;vllm/engine.py:profile;vllm/engine.py:run;vllm/engine.py:capture;"
                  "vllm/engine.py:warm_up"] == inner["vllm/engine.py:warm_up"]
