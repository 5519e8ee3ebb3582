"""Every reward name the config can use -> its implementation and parameters (one line per reward).

A user's own reward needs no line here: `name` may be a dotted path to its function (`resolve_reward`).

Defaults for a reward's parameters come from, lowest to highest: the `Param` default here, the `rewards.<name>`
section of the config (its keys that are parameters of that reward), the part's own keys in
`domains.<d>.rewards[i]`.
"""

from __future__ import annotations

import importlib
import math

from .code_reward import code_reward
from .judge import judge_request
from .language_reward import language_consistency
from .math_reward import fast_math_check, math_verify_reward
from .spec import Param, RewardSpec, positive
from .rule_rewards import char_fraction, env_verifier, exact_match, format_reward, length_penalty

_nonneg_int = dict(check=lambda x: x >= 0, hint="must be >= 0")
_pos = dict(check=positive, hint="must be > 0")


def _check_length(params: dict, max_new_tokens: int) -> None:
    if params["mode"] == "overlong":
        max_len = params["max_new_tokens"] or max_new_tokens
        if not params["buffer"]:
            raise ValueError("mode 'overlong' needs 'buffer' (tokens before max_new_tokens where the penalty ramps)")
        if not max_len or params["buffer"] > max_len:
            raise ValueError(f"mode 'overlong' needs 0 < buffer <= max_new_tokens (got buffer={params['buffer']}, "
                             f"max_new_tokens={max_len}); set rollout.max_new_tokens")
    elif params["target"] is None or not params["scale"]:
        raise ValueError("mode 'linear' needs 'target' (tokens) and 'scale' (> 0)")


REWARDS: dict[str, RewardSpec] = {
    "math": RewardSpec(math_verify_reward, runner="pool", fast=fast_math_check, params={
        "max_answer_chars": Param(int, 4000, **_pos),  # only the answer's tail is parsed
        "inner_timeout_s": Param(int, 5, **_pos),  # math-verify's own parse/verify timeouts
    }),
    "code": RewardSpec(code_reward, runner="threads", params={
        "mode": Param(str, "fraction", choices=("fraction", "all")),
        "wall_s": Param(float, 10.0, **_pos),
        "cpu_s": Param(int, 10, **_pos),
        "memory_mb": Param(int, 1024, **_pos),
        "output_bytes": Param(int, 1 << 20, **_pos),
        "max_procs": Param(int, 8, **_pos),
        "max_program_chars": Param(int, 100_000, **_pos),
        "network_namespace": Param(bool, True),
        "sandbox_uid_base": Param(int, 60000, **_pos),
        "require_os_isolation": Param(bool, False),  # refuse to run code without OS-level isolation
        "packages": Param((list, tuple), ("numpy",), check=lambda v: all(isinstance(x, str) for x in v),
                          hint="must be a list of package names"),  # third-party packages a program may import
        "max_write_mb": Param(int, 32, **_pos),  # write quota of one run
        # code run before the program (a PRELUDES preset name or Python code); null: none
        "prelude": Param(str, None, check=lambda v: bool(v.strip()), hint="must be a PRELUDES name or Python code"),
    }),
    "exact_match": RewardSpec(exact_match, params={"max_answer_chars": Param(int, 4000, **_pos)}),
    "format": RewardSpec(format_reward, params={
        # auto: the sample's own mode (domains.<d>.thinking; thinking where the domain sets none)
        "thinking": Param((bool, str), "auto", check=lambda v: isinstance(v, bool) or v == "auto",
                          hint="must be true, false or auto"),
        "think_in_prompt": Param(bool, False),
    }),
    "char_fraction": RewardSpec(char_fraction, params={
        "chars": Param(str, required=True, check=lambda s: len(s) > 0, hint="must not be empty"),
    }),
    "length": RewardSpec(length_penalty, score_range=(-1.0, 0.0), cross_check=_check_length, params={
        "mode": Param(str, "overlong", choices=("overlong", "linear")),
        "buffer": Param(int, None, **_nonneg_int),
        "max_new_tokens": Param(int, None, **_pos),  # default: rollout.max_new_tokens
        "target": Param(int, None, **_nonneg_int),
        "scale": Param(float, None, **_pos),
    }),
    "language": RewardSpec(language_consistency, params={
        "model": Param(str, "lite", choices=("lite",)),  # "full"/"auto" would try to download a model
        "min_detect_chars": Param(int, 12, **_pos),
        "max_segments": Param(int, 2000, **_pos),
    }),
    # An agent episode's outcome, as its environment's verifier scored it (the rollout runs the verifier).
    "env_verifier": RewardSpec(env_verifier),
    # Batched: the function only builds the request; the composer sends the whole batch's requests to the judge
    # (rewards/judge.py) in one call. Judge settings are global (`rewards.judge`): one judge model serves all.
    "rubric_judge": RewardSpec(judge_request, runner="judge"),
}



def resolve_reward(name: str) -> RewardSpec:
    """The spec of a reward name: one of REWARDS, or a user's own reward given as a dotted path to a module-level
    function (`my_pkg.rewards:score` or `my_pkg.rewards.score`, importable where the reward workers run) with the
    signature `fn(view: SampleView, params: dict) -> float`. A user's reward runs in the killable process pool with
    the same per-sample timeout and failure policy as the built-in ones; its part's other keys are its `params`,
    and any finite float is a valid score. Raises ValueError saying what is wrong."""
    if name in REWARDS:
        return REWARDS[name]
    if "." not in name and ":" not in name:
        raise ValueError(f"unknown reward '{name}'; known: {sorted(REWARDS)}, or a dotted path to your own function "
                         "(my_module.my_reward)")
    module, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except Exception as e:  # noqa: BLE001 - ImportError, AttributeError or an error inside the module
        raise ValueError(f"reward '{name}': could not import {attr!r} from module {module!r} "
                         f"({type(e).__name__}: {e})") from None
    if not callable(fn):
        raise ValueError(f"reward '{name}': {module}.{attr} is not callable")
    return RewardSpec(fn, runner="pool", score_range=(-math.inf, math.inf), any_params=True)
