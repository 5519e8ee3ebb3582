"""benchmarks/large_shape.py's readings of a run: the KV cache each vLLM instance sized (from the run's log) and
the host memory in use."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import large_shape  # noqa: E402


def test_kv_cache_tokens_are_read_from_each_vllm_instance_of_the_log(tmp_path):
    log = tmp_path / "train.log"
    assert large_shape.kv_cache_tokens(log) == []  # no log yet
    log.write_text("(EngineCore pid=1) INFO [kv_cache_utils.py:1087] GPU KV cache size: 2,693,984 tokens\n"
                   "noise \xff\n"
                   "INFO GPU KV cache size: 3468096 tokens\n"
                   "INFO Maximum concurrency for 40,960 tokens per request: 60.45x\n", errors="replace")
    assert large_shape.kv_cache_tokens(log) == [2693984, 3468096]


def test_host_memory_in_use_is_a_positive_number_of_mib_below_the_total():
    total_mib = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemTotal")).split()[1]) // 1024
    assert 0 < large_shape.host_memory_used() < total_mib
