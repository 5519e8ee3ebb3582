"""benchmarks/grpo_step.py: its split runs are layouts the run accepts (smol with two vLLM instances on the rollout
GPU, as `smol_math` runs two colocated), and their step throughput is reported against the one-GPU run with the same
trainer settings (eager against eager, compiled against compiled)."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from launch.config import check_config
from rl.config import engines_per_gpu
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def grpo_step(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports learn_real from its own directory
    return load_script(Path("benchmarks/grpo_step.py"))


@pytest.mark.parametrize("bench, engines", [("smol", 2), ("qwen06b", 1)])
def test_split_runs_are_layouts_the_run_accepts(grpo_step, bench, engines):
    overrides = grpo_step.replaced(bench, grpo_step.SPLIT[bench])
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smol_math", "model.path=/nonexistent", *overrides]), resolve=True)
    assert cfg["rollout"]["placement"] == "split" and cfg["rollout"]["max_staleness"] == 1
    assert engines_per_gpu(cfg) == engines
    check_config(cfg)


@pytest.mark.parametrize("bench, engines", [("smol", 2), ("qwen06b", 1)])
def test_data_parallel_runs_are_layouts_the_run_accepts(grpo_step, bench, engines):
    """ours_dp2: the bench's instances on each of two trainer GPUs, the reference partitioned over the two ranks."""
    overrides = grpo_step.replaced(bench, grpo_step.dp2(bench))
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smol_math", "model.path=/nonexistent", *overrides]), resolve=True)
    assert cfg["rollout"]["placement"] == "colocated" and cfg["trainer"]["num_processes"] == 2
    assert cfg["trainer"]["ref_placement"] == "sharded" and engines_per_gpu(cfg) == engines
    check_config(cfg)
    weak = grpo_step.replaced(bench, grpo_step.dp2(bench, 2))  # ours_dp2_weak: each GPU the one-GPU run's batch
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        one = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smol_math", "model.path=/nonexistent", *grpo_step.BENCHES[bench]["ours"]]), resolve=True)
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smol_math", "model.path=/nonexistent", *weak]), resolve=True)
    assert cfg["data"]["prompts_per_step"] == 2 * one["data"]["prompts_per_step"] and cfg["trainer"]["num_processes"] == 2
    check_config(cfg)


@pytest.mark.parametrize("bench", ["smol", "qwen06b"])
def test_the_step_benchmark_times_vllm_compiled_while_smol_math_starts_without(grpo_step, bench):
    """smol_math turns vLLM's compilation off for a sooner first step; the step benchmark times steps 2+, so its runs
    put vLLM's default (compiled) back."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        shipped = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smol_math", "model.path=/nonexistent"]), resolve=True)
        timed = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smol_math", "model.path=/nonexistent", *grpo_step.BENCHES[bench]["ours"]]), resolve=True)
    assert shipped["rollout"]["compile"] is False and timed["rollout"]["compile"] is True
    check_config(timed)


@pytest.mark.parametrize("bench", ["smol", "qwen06b"])
def test_overlap_run_keeps_vllm_awake_on_the_one_gpu(grpo_step, bench):
    """ours_overlap: colocated on one GPU, the instances never sleep, the next rollout runs while a step trains."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smol_math", "model.path=/nonexistent", *grpo_step.BENCHES[bench]["ours"],
            *grpo_step.OVERLAP]), resolve=True)
    assert cfg["rollout"]["placement"] == "colocated" and cfg["trainer"]["num_processes"] == 1
    assert cfg["rollout"]["enable_sleep_mode"] is False and cfg["rollout"]["max_staleness"] == 1
    assert cfg["trainer"]["compile"] is True
    check_config(cfg)


@pytest.mark.parametrize("bench", ["smol", "qwen06b"])
def test_fp8_run_is_the_overlap_run_with_an_fp8_cache_and_tis(grpo_step, bench):
    """ours_fp8: ours_overlap's layout, vLLM's KV cache in FP8, and pi_old recomputed by the trainer so the FP8
    engine's samples are weighted by truncated importance sampling."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smol_math", "model.path=/nonexistent", *grpo_step.BENCHES[bench]["ours"],
            *grpo_step.FP8]), resolve=True)
    assert cfg["rollout"]["enable_sleep_mode"] is False and cfg["rollout"]["max_staleness"] == 1
    assert cfg["rollout"]["kv_cache_dtype"] == "fp8" and cfg["algorithm"]["old_logprobs"] == "trainer"
    check_config(cfg)


def _metrics(path: Path, steps: list[float]) -> None:
    path.mkdir(parents=True)
    path.joinpath("metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "time/step": s, "time/rollout": s / 2, "perf/mfu": 0.2}) + "\n"
        for i, s in enumerate(steps)))


def test_split_throughput_is_against_the_one_gpu_run_with_the_same_trainer(grpo_step, tmp_path):
    _metrics(tmp_path / "smol-ours", [30.0, 2.0, 2.2, 2.0])
    _metrics(tmp_path / "smol-ours_compiled", [30.0, 1.6, 1.6, 1.6])
    # a split run's last step waits for no next rollout: short, and left out of its median
    _metrics(tmp_path / "smol-ours_split", [20.0, 0.9, 1.1, 0.3])
    _metrics(tmp_path / "smol-ours_split_compiled", [20.0, 0.7, 0.9, 0.3])
    _metrics(tmp_path / "smol-ours_dp2", [25.0, 1.1, 1.1, 1.1])
    _metrics(tmp_path / "smol-ours_dp2_weak", [25.0, 2.2, 2.4, 2.2])  # twice the samples a step
    _metrics(tmp_path / "smol-ours_overlap", [25.0, 1.0, 0.8, 0.3])  # one GPU, one step off: the last left out
    _metrics(tmp_path / "smol-ours_fp8", [25.0, 0.8, 0.8, 0.3])  # the same, against the same compiled run
    rows = {s["bench"]: s for s in grpo_step.summaries("smol", tmp_path)}
    assert rows["smol, colocated on 1 GPU"]["ours"] == 2.0  # median of steps 2.. (step 1 compiles and warms up)
    assert rows["smol, split on 2 GPUs, max_staleness 1"]["speedup"] == pytest.approx(2.0)
    assert rows["smol, split on 2 GPUs, max_staleness 1, trainer.compile"]["speedup"] == pytest.approx(2.0)
    # data parallel: every step counts (no step waits on a next rollout), against the eager one-GPU run
    assert rows["smol, colocated on 2 GPUs, data parallel (a reference sharded over the ranks)"]["speedup"] == pytest.approx(2.0 / 1.1)
    # twice the batch: samples per second against the one-GPU run's, 2 x 2.0 / 2.2
    assert rows["smol, colocated on 2 GPUs, data parallel, twice the prompts a step (each GPU ours' batch)"]["speedup"] == pytest.approx(4.0 / 2.2)
    assert rows["smol, colocated on 1 GPU, vLLM awake, max_staleness 1, trainer.compile"]["speedup"] == pytest.approx(1.6 / 0.9)
    assert rows["smol, colocated on 1 GPU, vLLM awake, max_staleness 1, trainer.compile, FP8 KV cache + TIS"][
        "speedup"] == pytest.approx(1.6 / 0.8)
    assert "2.00x" in grpo_step.table(list(rows.values()))


def test_verl_runs_go_to_verl_peer_with_their_setting_in_the_same_out(grpo_step, tmp_path, monkeypatch):
    """`--only verl_best` (with ours and TRL, one command on one machine): verl_peer.py's run of the bench at its
    best setting, written beside ours; nothing of verl runs unless asked."""
    import verl_peer

    calls = []
    monkeypatch.setattr(verl_peer, "check_cpus", lambda count=None: calls.append("cpus"))
    monkeypatch.setattr(verl_peer, "run_verl", lambda *a: calls.append(a))
    grpo_step.run_verl_peer("smol", "/models/smol", tmp_path, 6, 900.0, [])
    assert calls == []
    grpo_step.run_verl_peer("smol", "/models/smol", tmp_path, 6, 900.0, ["defaults", "best"])
    assert calls == ["cpus", ("smol", "defaults", "/models/smol", tmp_path.resolve(), 6, 900.0),
                     ("smol", "best", "/models/smol", tmp_path.resolve(), 6, 900.0)]
    assert grpo_step.VERL_RUNS == {"verl_defaults": "defaults", "verl_best": "best"}


def test_the_report_prints_verls_rows_from_its_runs_logs(grpo_step, tmp_path, monkeypatch, capsys):
    """A verl run of `--only verl_best` leaves its step log in --out; the report summarises it into verl's rows
    (it printed none when the run's own summary file had not been written)."""
    run = tmp_path / "verl_qwen06b_best"
    run.mkdir()
    run.joinpath("steps.jsonl").write_text("".join(
        json.dumps({"step": k, "data": {"timing_s/step": 18.0 + k, "timing_s/gen": 10.0}}) + "\n" for k in (1, 2, 3)))
    monkeypatch.setattr("sys.argv", ["grpo_step.py", "--out", str(tmp_path), "--bench", "qwen06b", "--report"])
    grpo_step.main()
    printed = capsys.readouterr().out
    assert "| qwen06b | best | 20.50 |" in printed
    # beside ours in the main table: verl's s/step per setting (defaults / best) and its fastest against ours
    assert "| qwen06b, colocated on 1 GPU | - | - / 20.50 | - | - | - |" in printed
    row = grpo_step.with_verl({"ours": 5.0}, {"defaults": 30.0, "best": 20.5})
    assert row["vs_verl"] == pytest.approx(4.1)
    assert grpo_step.with_verl({"ours": None}, {"best": 20.5})["vs_verl"] is None
    # a run whose logs are gone still shows from the summary file it left
    (tmp_path / "verl_qwen06b_defaults.json").write_text(json.dumps(
        {"bench": "qwen06b", "setting": "defaults", "steps": 6, "s_step": 30.0, "reward_mean": None,
         "response_length": None, "phases": dict.fromkeys(["gen", "reward", "old_log_prob", "ref", "adv",
                                                           "update_actor", "update_weights"], 1.0)}))
    grpo_step.main()
    assert "| qwen06b, colocated on 1 GPU | - | 30.00 / 20.50 | - | - | - |" in capsys.readouterr().out
    assert json.loads((tmp_path / "verl_qwen06b_best.json").read_text())["s_step"] == 20.5
