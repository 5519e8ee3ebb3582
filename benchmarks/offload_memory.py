"""Host bytes per parameter of the optimizer state with `trainer.offload_optimizer=cpu` (DeepSpeed ZeRO-Offload, our
DeepSpeed config: torch's fused AdamW on the host) against the state on the device, measured as the growth of this
process's resident memory from the partitioned model to after one optimizer step, on one CPU rank (gloo) and a
random Qwen3 shape. What a layout needs in host memory follows: bytes/parameter x parameters (all ranks of a node).

    python benchmarks/offload_memory.py --stage 3 --hidden 1024 --layers 12
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(stage: int, offload: bool, hidden: int, layers: int) -> tuple[int, int]:
    """(parameters, resident bytes added by deepspeed.initialize + one step)."""
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.policy import deepspeed_config

    config = AutoConfig.for_model("qwen3", hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                                  num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128, head_dim=64,
                                  vocab_size=32000, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    tcfg = {"zero_stage": stage, "grad_clip": 1.0, "lr": 1e-6, "betas": [0.9, 0.999], "weight_decay": 0.0,
            "warmup_steps": 0, "offload_optimizer": "cpu" if offload else "none"}
    ds_cfg = deepspeed_config(tcfg, "bfloat16", 1, 1, 1)
    if stage == 3:
        deepspeed.zero.Init(module=model, config_dict_or_path=ds_cfg)
    gc.collect()
    before = rss_bytes()
    engine = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=ds_cfg)[0]
    ids = torch.randint(0, 32000, (1, 64))
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    gc.collect()
    grown = rss_bytes() - before
    engine.destroy()
    return n, grown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--offload", choices=["cpu", "none"], default="cpu")
    args = ap.parse_args()
    from trainer.dist import init_process_group, open_store

    store = open_store()
    init_process_group(0, 1, "127.0.0.1", store.port, "cpu")
    n, grown = measure(args.stage, args.offload == "cpu", args.hidden, args.layers)
    print(f"[offload_memory] ZeRO-{args.stage} offload_optimizer={args.offload}: {n / 1e6:.0f}M parameters, host "
          f"memory +{grown / 2**30:.2f} GiB = {grown / n:.1f} bytes/parameter", flush=True)


if __name__ == "__main__":
    main()
