"""`python -m launch.sft +experiment=sft [overrides]`: supervised fine-tuning on chat data, i.e. `python -m launch.train`
with `algorithm=sft` (conf/algorithm/sft.yaml). One loop and one trainer for both: the objective picks the loss and
the sample source (a dataset instead of rollouts), the rest (Hydra, DeepSpeed, checkpoints, resume, W&B) is the same."""

from __future__ import annotations

import sys

from launch.train import cli


def with_sft(args: list[str]) -> list[str]:
    """The command line with `algorithm=sft` first, unless it names the algorithm group itself."""
    if any(a.split("=", 1)[0].lstrip("+~") == "algorithm" for a in args if "=" in a):
        return list(args)
    return ["algorithm=sft", *args]


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *with_sft(sys.argv[1:])]
    cli()
