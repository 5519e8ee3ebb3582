"""benchmarks/rollout_engines.py (issue 37): ours against plain vLLM at the same work, side by side. Each
configuration's median over its repeats is compared with plain vLLM's one instance; the engine kinds and the
instance counts the command names all run."""

from pathlib import Path

import pytest

from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def rollout_engines(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports rollout_capture from its own directory
    return load_script(Path("benchmarks/rollout_engines.py"))


def _rows(engine, k, values):
    return [dict(engine=engine, instances=k, repeat=i, tokens=100, seconds=1.0, tokens_per_s=v, per_instance_s=[1.0] * k,
                 start_s=[30.0] * k) for i, v in enumerate(values)]


def test_each_configuration_is_its_median_against_plain_vllm(rollout_engines):
    rows = (_rows("vllm", 1, [26738, 24647, 24189, 24550]) + _rows("ours", 1, [26021, 24693, 22669, 23872])
            + _rows("ours", 2, [40000, 20000, 42000]))
    out = rollout_engines.side_by_side(rows)
    assert [key for key, _, _ in out] == [("vllm", 1), ("ours", 1), ("ours", 2)]
    (_, base, zero), (_, ours1, d1), (_, ours2, d2) = out
    assert base == pytest.approx(24598.5) and zero == 0.0  # the median of an even count: the middle two's mean
    assert ours1 == pytest.approx(24282.5) and d1 == pytest.approx(24282.5 / 24598.5 - 1)
    assert ours2 == 40000 and d2 == pytest.approx(40000 / 24598.5 - 1)


def test_without_plain_vllm_there_is_no_difference(rollout_engines):
    assert rollout_engines.side_by_side(_rows("ours", 2, [1.0, 3.0])) == [(("ours", 2), 2.0, None)]


def test_the_command_names_both_engines_and_their_run_settings(rollout_engines, monkeypatch):
    seen = []
    monkeypatch.setattr(rollout_engines, "run", lambda args, path, k: seen.append(
        (args.engine, k, args.per_sample, args.sleep_mode)) or _rows(args.engine, k, [1.0]))
    monkeypatch.setattr("sys.argv", ["rollout_engines.py", "--model", "dense", "--prompts", "16", "--engines", "1", "2",
                                     "--engine", "vllm", "ours", "--per-sample", "--sleep-mode",
                                     "--workdir", "/nonexistent"])
    monkeypatch.setattr("launch.testbed.build_model", lambda path, cfg: str(path))
    rollout_engines.main()
    assert seen == [("vllm", 1, True, True), ("vllm", 2, True, True), ("ours", 1, True, True), ("ours", 2, True, True)]
