"""benchmarks/vllm_start.py: the stack samples faulthandler writes while an engine starts, read back per function.
The start itself needs vLLM on a GPU; here a stand-in module under a `vllm/` folder is sampled for real."""

import subprocess
import sys
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

MAIN = """\
import faulthandler, sys, threading, time
sys.path.insert(0, sys.argv[1])
from vllm import engine
threading.Thread(target=time.sleep, args=(3,), daemon=True).start()  # another thread, never counted
faulthandler.dump_traceback_later(0.1, repeat=True, file=open(sys.argv[2], "w"))
engine.load()
engine.start()
faulthandler.cancel_dump_traceback_later()
"""


def test_stack_samples_are_summed_per_function_of_the_main_thread(tmp_path):
    (tmp_path / "pkg" / "vllm").mkdir(parents=True)
    (tmp_path / "pkg" / "vllm" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "vllm" / "engine.py").write_text(ENGINE)
    (tmp_path / "vllm_start.py").write_text(MAIN)
    stacks = tmp_path / "stacks.txt"
    subprocess.run([sys.executable, str(tmp_path / "vllm_start.py"), str(tmp_path / "pkg"), str(stacks)], check=True,
                   timeout=60)
    found = vllm_start.samples(stacks.read_text())
    assert 15 <= len(found) <= 22  # ~2 s at one sample per 0.1 s
    assert all(frames[0][1] == "<module>" for frames in found)  # outermost first
    summary = vllm_start.where(found)
    inner = dict(summary["innermost"])
    assert set(inner) == {"vllm/engine.py:warm_up", "vllm/engine.py:load"}
    assert inner["vllm/engine.py:warm_up"] > 2 * inner["vllm/engine.py:load"]
    assert dict(summary["phase"]) == {"vllm/engine.py:warm_up": inner["vllm/engine.py:warm_up"]}
