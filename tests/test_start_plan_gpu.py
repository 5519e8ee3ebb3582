"""Start plans on a GPU (rollout/vllm_start_plan.py).

Measured: in a machine's first run `smol_math`'s two vLLM instances of one GPU (made unsized:
`rollout.max_num_seqs=null`) start one after the other: the first measures the GPU's memory, the second starts with
the size the first got (no measurement of its own), and both record it; the next run with the same settings starts
both side by side with those sizes, and gets the same KV caches (vLLM's own "GPU KV cache size" lines).
Sized: `smol_math` as shipped starts both at once in its first run, each with exactly max_num_seqs x max_model_len
tokens of KV cache, and records no plan. The seconds these save are measured by benchmarks/cold_start.py, not
asserted here.

Run on the device: `pytest -m gpu tests/test_start_plan_gpu.py -s` (three runs of one step each, ~4 min on an H200).
"""

from __future__ import annotations

import os
import re
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


def one_step(run_dir: Path, cache: Path, *overrides: str) -> str:
    """One step of smol_math with its own MIXRL_CACHE (where the plans live); returns its train.log."""
    cmd = [sys.executable, "-m", "launch.train", "+experiment=smol_math", f"run_dir={run_dir}",
           "trainer.total_steps=1", "eval.every=0", "eval.before_train=false", "trainer.save_last=false",
           "logger.mode=disabled", "logger.progress_bar=false", *overrides]
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "MIXRL_CACHE": str(cache)}, capture_output=True,
                          text=True, timeout=900)
    log = (run_dir / "train.log").read_text(errors="replace") if (run_dir / "train.log").exists() else ""
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:] + log[-4000:]
    return log


def kv_cache_tokens(log: str) -> list[int]:
    return sorted(int(n.replace(",", "")) for n in re.findall(r"GPU KV cache size: ([\d,]+) tokens", log))


def test_the_second_run_starts_both_instances_of_the_gpu_with_the_sizes_the_first_measured(tmp_path):
    cache = tmp_path / "cache"
    first = one_step(tmp_path / "first", cache, "rollout.max_num_seqs=null")
    assert "wave 0 of 2 starts now" not in first  # nothing recorded yet: the instances go in turn,
    assert "wave 1 of 2 starts with the" in first  # and the second takes the size the first measured
    assert len(list((cache / "vllm_start").glob("*.json"))) == 2  # one plan per wave
    second = one_step(tmp_path / "second", cache, "rollout.max_num_seqs=null")
    assert "wave 0 of 2 starts now" in second and "wave 1 of 2 starts now" in second
    sizes = kv_cache_tokens(first)
    print("KV cache tokens per instance, first / second run:", sizes, kv_cache_tokens(second))
    assert len(sizes) == 2 and sizes[0] == sizes[1]  # the second instance took the first's size
    assert kv_cache_tokens(second) == sizes


def test_a_sized_first_run_starts_both_instances_at_once_with_their_max_num_seqs_by_max_model_len(tmp_path):
    cache = tmp_path / "cache"
    log = one_step(tmp_path / "sized", cache)
    assert log.count("max_num_seqs x max_model_len") == 2
    assert "wave 0 of 2 starts now" in log and "wave 1 of 2 starts now" in log
    assert not (cache / "vllm_start").exists()  # nothing measured, nothing recorded
    print("KV cache tokens per instance, sized:", kv_cache_tokens(log))
    assert kv_cache_tokens(log) == [256 * 768] * 2  # smol_math's max_num_seqs x max_model_len, in 16-token blocks
