"""Config composition and start-up validation; the domain mixture's data loading, order and resume."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from launch.config import check_config
from rl.config import ConfigError
from rl.data import PromptMixture, load_domain_rows
from rl.models import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def composed(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["+experiment=mixed_rl", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def test_mixed_rl_composes_and_validates():
    cfg = composed("domains.math.kl_coef=0.05")
    check_config(cfg)
    assert cfg["domains"]["math"]["kl_coef"] == 0.05
    assert {"math", "code", "logic", "general"} <= set(cfg["domains"])


@pytest.mark.parametrize(
    "override, key",
    [
        ("+domains.math.klcoef=0.1", "domains.math.klcoef"),
        ("domains.math.kl_coef=-0.1", "domains.math.kl_coef"),
        ("domains.code.opsm_delta=-1", "domains.code.opsm_delta"),
        ("domains.math.weight=-1", "domains.math.weight"),  # 0 switches a domain off (test_reliability)
        ("rollout.top_p=1.5", "rollout.top_p"),
        ("trainer.mini_batches=3", "trainer.mini_batches"),
        ("algorithm.loss_aggregation=sum", "algorithm.loss_aggregation"),
        ("+domains.math.dataset.colums={prompt: q}", "domains.math.dataset.colums"),
        ("trainer.compile=maybe", "trainer.compile"),
        ("+rollout.compile=maybe", "rollout.compile"),
        ("+rollout.max_num_seqs=0", "rollout.max_num_seqs"),
        ("+rollout.max_model_len=long", "rollout.max_model_len"),
    ],
)
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("[", r"\[")):
        check_config(composed(override))


VLLM_COLOCATED = ("rollout=vllm", "trainer.num_gpus=0.4", "rollout.num_gpus=0.4", "trainer.device=cuda",
                  "trainer.ref_num_gpus=0.1", "rewards.judge.num_gpus=0.1")


@pytest.mark.parametrize(
    "overrides, match",
    [
        # the shares that land on GPU 0 add up to more than one GPU
        (("trainer.ref_num_gpus=0.3",), r"rollout\.num_gpus 0\.4 \+ trainer\.num_gpus 0\.4 \+ trainer\.ref_num_gpus 0\.3"),
        # the reference (KL domains) would see no GPU
        (("trainer.ref_num_gpus=0",), r"trainer\.ref_num_gpus"),
        (("trainer.num_gpus=0",), r"trainer\.num_gpus must be > 0"),
        # 3 vLLM instances cannot split evenly over 2 trainer GPUs
        (("rollout.num_workers=3", "trainer.num_processes=2"), r"multiple of trainer\.num_processes"),
        # two instances on the GPU take two rollout shares
        (("rollout.num_workers=2",), r"2 x rollout\.num_gpus 0\.8 \+ trainer\.num_gpus 0\.4"),
        # ... and each its own memory: three at vLLM's 0.4 would want 1.2 of the GPU
        (("rollout.num_workers=3", "rollout.num_gpus=0.1"), r"3 x 0\.4 leaves nothing for the trainer"),
        # split: two instances on a rollout GPU, each at vLLM's 0.5, would want all of it
        (("rollout.placement=split", "rollout.num_workers=2", "rollout.num_gpus=0.5", "rollout.gpu_memory_utilization=0.5"),
         r"2 x 0\.5 is all of the GPU"),
        # ... and a tensor-parallel instance cannot run on half a GPU
        (("rollout.placement=split", "rollout.num_gpus=0.5", "rollout.tensor_parallel_size=2"),
         r"tensor_parallel_size == 1"),
        # colocated tensor parallel: one instance over every T trainer GPUs
        (("rollout.tensor_parallel_size=2", "trainer.num_processes=2", "rollout.num_workers=2"),
         r"rollout\.num_workers = trainer\.num_processes / 2 \(got 2 and 2\)"),
        (("rollout.tensor_parallel_size=3", "trainer.num_processes=4", "rollout.num_workers=1"),
         r"multiple of it"),
        (("rollout.tensor_parallel_size=2", "trainer.num_processes=2", "rollout.num_workers=1", "rollout.engine=auto"),
         r"rollout\.tensor_parallel_size=2 needs rollout\.engine=vllm"),
        (("trainer.ref_placement=beside",), r"trainer\.ref_placement"),
        (("rollout.placement=spread",), r"rollout\.placement"),
        (("rollout.max_staleness=1",), r"rollout\.max_staleness.*colocated vLLM"),
    ],
)
def test_bad_gpu_layout_names_the_key(overrides, match):
    check_config(composed(*VLLM_COLOCATED))  # the layout itself is fine: 0.4 + 0.4 + 0.1 + 0.1
    # and so is one tensor-parallel instance over two trainer GPUs, the reference sharded over the ranks
    check_config(composed(*VLLM_COLOCATED, "rollout.tensor_parallel_size=2", "trainer.num_processes=2",
                          "rollout.num_workers=1", "trainer.ref_placement=sharded", "trainer.zero_stage=3"))
    with pytest.raises(ConfigError, match=match):
        check_config(composed(*VLLM_COLOCATED, *overrides))


def test_colocated_overlap_needs_engines_that_stay_awake():
    """max_staleness=1 with colocated vLLM: refused while the instances sleep as the trainer trains (nothing could
    generate then), taken when they keep their memory (rollout.enable_sleep_mode=false) and so can."""
    with pytest.raises(ConfigError, match=r"rollout\.enable_sleep_mode=false"):
        check_config(composed(*VLLM_COLOCATED, "rollout.max_staleness=1"))
    cfg = composed(*VLLM_COLOCATED, "rollout.max_staleness=1", "rollout.enable_sleep_mode=false")
    check_config(cfg)
    assert cfg["rollout"]["max_staleness"] == 1


def test_fp8_kv_cache_is_a_vllm_setting_checked_by_name():
    """rollout.kv_cache_dtype: vLLM's names only, and only where vLLM generates (the hf engine's cache is
    model.dtype); bitwise on-policy refuses it, since the trainer would replay attention over other values."""
    cfg = composed(*VLLM_COLOCATED, "rollout.kv_cache_dtype=fp8", "algorithm.old_logprobs=trainer")
    check_config(cfg)
    assert cfg["rollout"]["kv_cache_dtype"] == "fp8"
    assert composed(*VLLM_COLOCATED)["rollout"]["kv_cache_dtype"] == "auto"  # the shipped default
    with pytest.raises(ConfigError, match=r"rollout\.kv_cache_dtype.*fp8_e4m3"):
        check_config(composed(*VLLM_COLOCATED, "rollout.kv_cache_dtype=int4"))
    with pytest.raises(ConfigError, match=r"rollout\.kv_cache_dtype=fp8 is a vLLM setting"):
        check_config(composed(*VLLM_COLOCATED, "rollout.engine=hf", "rollout.kv_cache_dtype=fp8"))
    with pytest.raises(ConfigError, match=r"rollout\.kv_cache_dtype=auto"):
        check_config(composed(*VLLM_COLOCATED, "rollout.kv_cache_dtype=fp8", "algorithm.on_policy=bitwise",
                              "trainer.device=cuda"))


@pytest.mark.parametrize("override, match", [
    ("trainer.compile=1", r"trainer\.compile must be one of \['False', 'True'\], got 1"),
    ("rollout.compile=0", r"rollout\.compile must be one of"),
    ("rollout.payload_by_reference=1", r"rollout\.payload_by_reference must be one of"),
    ("trainer.gradient_checkpointing=1", r"trainer\.gradient_checkpointing must be one of"),
    ("trainer.zero_stage=true", r"trainer\.zero_stage must be one of \['0', '1', '2', '3'\], got True"),
])
def test_switches_take_true_or_false_and_counts_take_numbers(override, match):
    """One check for every switch: 1/0 are not true/false (Python's 1 == True let some keys take them), and
    true is not the number 1 (trainer.zero_stage=true would have meant ZeRO-1)."""
    with pytest.raises(ConfigError, match=match):
        check_config(composed(*VLLM_COLOCATED, override))
    check_config(composed(*VLLM_COLOCATED, "trainer.compile=true", "rollout.compile=false",
                          "rollout.payload_by_reference=false", "trainer.zero_stage=1"))


def test_gpu_shares_of_a_colocated_run():
    from launch.placement import colocated_shares

    assert colocated_shares(composed(*VLLM_COLOCATED)) == {
        "rollout.num_gpus": 0.4, "trainer.num_gpus": 0.4, "trainer.ref_num_gpus": 0.1, "rewards.judge.num_gpus": 0.1}
    # no KL domain: no reference share; a judge on a whole GPU of its own: outside the group; split: no group
    no_kl = composed(*VLLM_COLOCATED, "rewards.judge.num_gpus=1", *(f"domains.{d}.kl_coef=0" for d in
                                                                   ("code", "logic", "general", "agent")))
    assert colocated_shares(no_kl) == {"rollout.num_gpus": 0.4, "trainer.num_gpus": 0.4}
    assert colocated_shares(composed(*VLLM_COLOCATED, "rollout.placement=split")) == {}
    two = composed(*VLLM_COLOCATED, "rollout.num_workers=2", "rollout.num_gpus=0.2")  # two vLLM instances per GPU
    check_config(two)
    assert colocated_shares(two) == {
        "2 x rollout.num_gpus": 0.4, "trainer.num_gpus": 0.4, "trainer.ref_num_gpus": 0.1, "rewards.judge.num_gpus": 0.1}
    assert colocated_shares(composed()) == {}  # the CPU default (hf engine)


def test_no_domains_is_a_clear_error():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train"), resolve=True)
    with pytest.raises(ConfigError, match="experiment"):
        check_config(cfg)


def test_missing_column_and_absent_file(tmp_path):
    with pytest.raises(ConfigError, match=r"domains\.math\.dataset\.columns\.answer.*'solution'"):
        load_domain_rows("math", {"path": "bundled:math.jsonl", "columns": {"prompt": "question", "answer": "solution"}})
    with pytest.raises(ConfigError, match=r"domains\.math\.dataset\.path.*not found"):
        load_domain_rows("math", {"path": str(tmp_path / "nope.jsonl"), "columns": {"prompt": "q"}})
    # A field a reward needs (here `answer`) but not mapped falls back to a same-named column, and must exist.
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps({"question": "1+1?"}) + "\n")
    with pytest.raises(ConfigError, match=r"domains\.math\.dataset\.columns\.answer"):
        load_domain_rows("math", {"path": str(f), "columns": {"prompt": "question"}}, required={"answer"})


def test_cli_rejects_bad_config_before_starting_anything():
    proc = subprocess.run(
        [sys.executable, "-m", "launch.train", "+experiment=mixed_rl", "domains.math.kl_coef=-1",
         "logger.mode=disabled", "run_dir=/tmp/mixrl-bad-config"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "domains.math.kl_coef" in proc.stderr + proc.stdout


def _mixture(tok, seed=1, weights=(3.0, 1.0)):
    domains = {
        "math": {"weight": weights[0], "dataset": {"path": "bundled:math.jsonl", "columns": {"prompt": "question", "answer": "answer"}}},
        "more": {"weight": weights[1], "dataset": {"path": "bundled:math.jsonl", "columns": {"prompt": "question"}, "system_prompt": "Be brief."}},
    }
    return PromptMixture(domains, tok, seed=seed, max_prompt_tokens=512)


def test_mixture_is_deterministic_weighted_and_resumable(tiny_dense_path):
    tok = load_tokenizer(tiny_dense_path)
    a, b = _mixture(tok), _mixture(tok)
    first = [a.next_batch(8) for _ in range(3)]
    assert [[p["index"] for p in s] for s in first] == [[p["index"] for p in b.next_batch(8)] for _ in range(3)]
    state = json.loads(json.dumps(a.state_dict()))
    upcoming = [a.next_batch(8) for _ in range(2)]
    c = _mixture(tok)
    c.load_state_dict(state)
    assert [[(p["domain"], p["index"]) for p in s] for s in upcoming] == [
        [(p["domain"], p["index"]) for p in c.next_batch(8)] for _ in range(2)
    ]
    many = [p["domain"] for _ in range(50) for p in a.next_batch(8)]
    assert 0.65 < many.count("math") / len(many) < 0.85  # weight 3:1
    p = c.next_batch(1)[0]
    assert p["prompt_ids"] == tok(p["prompt_text"], add_special_tokens=False)["input_ids"]


def test_mixture_epochs_cover_every_row_once(tiny_dense_path):
    tok = load_tokenizer(tiny_dense_path)
    m = PromptMixture(
        {"math": {"weight": 1.0, "dataset": {"path": "bundled:math.jsonl", "columns": {"prompt": "question"}}}},
        tok, seed=5, max_prompt_tokens=512,
    )
    seen = [p["index"] for _ in range(30) for p in m.next_batch(10)]
    assert sorted(seen) == list(range(300))


def test_long_prompts_are_skipped(tiny_dense_path):
    tok = load_tokenizer(tiny_dense_path)
    m = PromptMixture(
        {"math": {"weight": 1.0, "dataset": {"path": "bundled:math.jsonl", "columns": {"prompt": "question"}}}},
        tok, seed=5, max_prompt_tokens=30,
    )
    batch = m.next_batch(20)
    assert all(len(p["prompt_ids"]) <= 30 for p in batch) and m.skipped_too_long > 0
    with pytest.raises(ConfigError, match="max_prompt_tokens"):
        PromptMixture(
            {"math": {"weight": 1.0, "dataset": {"path": "bundled:math.jsonl", "columns": {"prompt": "question"}}}},
            tok, seed=5, max_prompt_tokens=3,
        ).next_batch(1)


def test_unsupported_moe_with_keep_routing_fails_at_start(tmp_path, tiny_moe_path, tiny_dense_path):
    from transformers import AutoConfig

    from launch.config import model_is_moe

    AutoConfig.for_model("granitemoe", num_local_experts=4, num_experts_per_tok=2).save_pretrained(tmp_path)
    for keep_routing in ("auto", True):
        with pytest.raises(ConfigError, match=r"algorithm\.keep_routing.*granitemoe"):
            model_is_moe(str(tmp_path), keep_routing)
    assert model_is_moe(str(tmp_path), False) is True
    assert model_is_moe(tiny_moe_path, "auto") is True and model_is_moe(tiny_dense_path, "auto") is False


def test_v32_clips_symmetrically_by_default():
    a = composed()["algorithm"]
    assert a["clip_eps_low"] == a["clip_eps_high"] == 0.2  # clip-higher (DAPO) is an option, not the default


def test_compiled_layers_need_zero_2_or_less():
    check_config(composed("trainer.compile=true", "trainer.zero_stage=2"))
    with pytest.raises(ConfigError, match=r"trainer\.compile=true needs trainer\.zero_stage <= 2"):
        check_config(composed("trainer.compile=true", "trainer.zero_stage=3"))


def test_optimizer_offload_is_none_or_cpu_and_needs_a_zero_stage():
    check_config(composed("trainer.offload_optimizer=cpu", "trainer.zero_stage=1"))
    with pytest.raises(ConfigError, match=r"trainer\.offload_optimizer=cpu needs trainer\.zero_stage >= 1"):
        check_config(composed("trainer.offload_optimizer=cpu", "trainer.zero_stage=0"))
    with pytest.raises(ConfigError, match=r"trainer\.offload_optimizer must be one of \['cpu', 'none'\]"):
        check_config(composed("trainer.offload_optimizer=nvme"))


def test_vllm_engine_core_is_in_process_or_subprocess():
    assert composed(*VLLM_COLOCATED)["rollout"]["engine_core"] == "in_process"
    check_config(composed(*VLLM_COLOCATED, "rollout.engine_core=subprocess"))
    with pytest.raises(ConfigError, match=r"rollout\.engine_core must be one of \['in_process', 'subprocess'\]"):
        check_config(composed(*VLLM_COLOCATED, "rollout.engine_core=inline"))
