"""`algorithm.on_policy=bitwise` on a GPU (issue 39): the trainer's logprobs of the sampled tokens must be the engine's,
every one of them, bit for bit.

- `benchmarks/bitwise_probe.py` (engine and trainer in one process) on SmolLM2-135M-Instruct (head size 64, past
  128 keys: FA3's decode tile) and on a random Qwen3 shape with top-p sampling and a temperature (kept sets, vLLM's
  temperature kernel);
- `launch.train +experiment=smol_math algorithm.on_policy=bitwise` with OPSM on: `mismatch/logprob_abs` exactly
  0.0 and nothing masked on every step.

Run on the device: `pytest -m gpu tests/test_bitwise_gpu.py -s` (Hopper, vLLM with FA3; 3 passed in 356 s on an H200).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # pragma: no cover - CPU machines with vllm installed
    pytest.skip("needs CUDA", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]


def results(args: list[str], tmp_path: Path) -> dict:
    done = subprocess.run([sys.executable, "benchmarks/bitwise_probe.py", "--workdir", str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return {r["check"]: r for r in rows}


@pytest.mark.parametrize("args", [
    ["--model", "smollm2", "--prompts", "16", "--n", "4", "--max-new-tokens", "160"],
    ["--model", "qwen3", "--prompts", "8", "--n", "4", "--max-new-tokens", "160", "--top-p", "0.95",
     "--temperature", "0.8"],
], ids=["smollm2", "qwen3-top_p-temperature"])
def test_every_sampled_logprob_is_the_engines(args, tmp_path):
    found = results(args, tmp_path)
    print(found["bitwise"], found.get("by_keys"))
    assert found["bitwise"]["tokens"] > 0
    assert found["bitwise"]["cut"] == 0  # every kept set recorded (a flat random model keeps ~140k ids a row)
    assert found["bitwise"]["equal_frac"] == 1.0 and found["bitwise"]["max_abs"] == 0.0
    assert found["rope_table"]["equal"]


def test_a_training_run_sees_no_mismatch_and_masks_nothing(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "launch.train", "+experiment=smol_math", f"run_dir={run_dir}",
           "algorithm.on_policy=bitwise", "domains.math.opsm_delta=0.0001", "trainer.total_steps=4", "eval.every=0",
           "eval.before_train=false", "trainer.save_last=false", "logger.mode=disabled", "logger.progress_bar=false"]
    env = {**os.environ, "DS_ACCELERATOR": "cuda"}  # conftest.py pins DeepSpeed to the CPU for CI
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print([(r["step"], r["mismatch/logprob_abs"], r["opsm/masked_frac"], r["time/step"]) for r in rows])
    assert len(rows) == 4
    assert all(r["mismatch/logprob_abs"] == 0.0 for r in rows)
    assert all(r["opsm/masked_frac"] == 0.0 for r in rows)  # every ratio is exactly 1 on the first pass
