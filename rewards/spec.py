"""What a reward is: the sample view it reads, its spec (function, typed parameters, where it runs) and the
parameter checks made when the composer is built. The table of rewards by name is `rewards/registry.py`.

Adding a reward = write `def my_reward(view: SampleView, params: dict) -> float` and add one line to `REWARDS`
in `rewards/registry.py`. Where a reward runs is part of its spec:
- "inline": in the composer's process. Only for code that is linear in the input and cannot hang.
- "pool":   in a process of the killable pool, with a per-sample timeout (the process is killed on timeout).
            The function and its arguments must be picklable (module-level function).
- "threads": in a thread of the composer; only for rewards that bound their own time by running the untrusted
            part in a subprocess they kill themselves (code). Their deadline is passed in `params["_deadline"]`.
- "judge":  batched: `fn` only turns a sample into a judge request; the composer sends all requests of a batch
            to the judge in one call bounded by `rewards.judge.timeout_s` (rubric_judge, see rewards/judge.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class SampleView:
    """What a reward function reads: picklable, sanitised, independent of token ids."""

    response: str  # whole response, reasoning included, sanitised
    answer: str  # answer part (after `</think>`), see text.answer_part
    sample: dict  # dataset row: prompt, answer, tests, rubric, language...
    finish_reason: str  # "stop" | "length"
    num_response_tokens: int  # tokens the model generated (tool output of an agent episode not counted)
    domain: str
    max_new_tokens: int  # rollout.max_new_tokens
    episode: dict | None = None  # multi-turn: the episode's record, with the environment verifier's outcome
    thinking: bool | None = None  # the sample's thinking mode (domains.<d>.thinking); None when the domain sets none


class RewardZero(Exception):
    """Raised by a reward to say "this sample scores 0 for this reason" (no code block, sandbox timeout...).

    Unlike any other exception it is an expected outcome: the composer records the reason but does not log a
    warning for it.
    """


@dataclass(frozen=True)
class Param:
    type: type | tuple[type, ...]
    default: Any = None
    required: bool = False
    choices: tuple | None = None
    check: Callable[[Any], bool] | None = None  # extra validity test
    hint: str = ""  # shown when `check` fails


@dataclass(frozen=True)
class RewardSpec:
    fn: Callable[[SampleView, dict], float]
    params: dict[str, Param] = field(default_factory=dict)
    runner: str = "inline"  # inline | pool | threads | judge (see module docstring)
    score_range: tuple[float, float] = (0.0, 1.0)  # checked on every result; penalties use (-1, 0)
    # Checks between parameters, called with (params, max_new_tokens); raises ValueError.
    cross_check: Callable[[dict, int], None] | None = None
    any_params: bool = False  # a user's own reward (a dotted path): its part's other keys are passed as they are
    # Pool rewards only: an exact in-process shortcut, linear in the input, that returns the score or None when
    # `fn` must decide (in the pool). Must agree with `fn` wherever it returns a score.
    fast: Callable[[SampleView, dict], float | None] | None = None


# Keys every part accepts, handled by the composer rather than the reward.
COMMON_KEYS = {"name", "weight", "timeout_s", "label", "isolated"}


def positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def validate_params(spec: RewardSpec, given: dict, where: str) -> dict:
    """Defaults + type/choice checks. Raises ValueError naming `where` (e.g. `domains.math.rewards[1]`)."""
    unknown = sorted(set(given) - set(spec.params) - COMMON_KEYS)
    if unknown and not spec.any_params:
        raise ValueError(f"{where}: unknown parameter(s) {unknown}; allowed: {sorted(spec.params)}")
    out = {key: given[key] for key in unknown}
    for key, p in spec.params.items():
        if key not in given or given[key] is None:
            if p.required:
                raise ValueError(f"{where}: parameter '{key}' is required")
            out[key] = p.default
            continue
        value = given[key]
        # ints are acceptable where floats are asked for; bools are not numbers here.
        if p.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        want = p.type.__name__ if isinstance(p.type, type) else "/".join(t.__name__ for t in p.type)
        if isinstance(value, bool) and bool not in (p.type if isinstance(p.type, tuple) else (p.type,)):
            raise ValueError(f"{where}: parameter '{key}' must be {want}, got a bool")
        if not isinstance(value, p.type):
            raise ValueError(f"{where}: parameter '{key}' must be {want}, got {type(value).__name__} {value!r}")
        if p.choices is not None and value not in p.choices:
            raise ValueError(f"{where}: parameter '{key}' must be one of {list(p.choices)}, got {value!r}")
        if p.check is not None and not p.check(value):
            raise ValueError(f"{where}: parameter '{key}'={value!r} is invalid: {p.hint}")
        out[key] = value
    return out
