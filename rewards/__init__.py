"""Reward functions: plain callables `(completions, **row) -> list[float | None]`.

Dataset columns arrive as keyword arguments (`answer=`, `problem=`, any other column). None means "no signal".
Built-ins are looked up by name in `REWARDS`; `module:function` loads a user's own.

>>> load_reward("math")(["so \\\\boxed{0.5}"], answer="\\\\frac{1}{2}")
[1.0]
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from rewards.answers import extract_answer, normalize
from rewards.judge import LLMJudge
from rewards.math_answer import math_reward
from rewards.text import choice_letter, exact_match, normalized_match, numeric_match, regex_match
from rewards.vote import majority_vote

__all__ = [
    "REWARDS",
    "LLMJudge",
    "RewardLoadError",
    "choice_letter",
    "exact_match",
    "extract_answer",
    "load_reward",
    "majority_vote",
    "math_reward",
    "normalize",
    "normalized_match",
    "numeric_match",
    "regex_match",
]

Reward = Callable[..., Any]

REWARDS: dict[str, Reward] = {
    "math": math_reward,
    "exact": exact_match,
    "normalized": normalized_match,
    "numeric": numeric_match,
    "regex": regex_match,
    "choice": choice_letter,
    "majority": majority_vote,
}

# Rewards that need no reference answer in the dataset.
ANSWER_FREE = {"majority", "regex"}


class RewardLoadError(ValueError):
    """The reward name is neither built in nor an importable `module:function`."""


def load_reward(name: str, judge_backend: Any = None) -> Reward:
    """A built-in reward by name, `judge` (needs `judge_backend`), or a user's own `package.module:function`."""
    if name == "judge":
        if judge_backend is None:
            raise RewardLoadError("the `judge` reward needs a backend to ask")
        return LLMJudge(judge_backend)
    if name in REWARDS:
        return REWARDS[name]
    if ":" not in name:
        known = ", ".join(sorted([*REWARDS, "judge"]))
        raise RewardLoadError(f"unknown reward {name!r}: use one of {known}, or module:function")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardLoadError(f"cannot import {module_name!r} for reward {name!r}: {exc}") from None
    reward = getattr(module, attr, None)
    if not callable(reward):
        raise RewardLoadError(f"{module_name!r} has no callable {attr!r}")
    return reward
