"""The reward for recorded traffic: what users said where they said it, a configured reward elsewhere.

Rows come from `gym_tf.traffic.problem_row`: `answer` is a user's correction, or the served answer a user rated up;
`label` says which (`correction`, `up`, `down`, `comment` only, `none`); `served_answer` is what the user was shown.

- a reference (correction or thumbs up): the base reward against it, as for any dataset with answers;
- thumbs down, no correction: completions that agree with the served answer score 0 (the user said it was wrong),
  the others get the fallback's score;
- no feedback: the fallback (by default the majority pseudo-reward).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable

from rewards.answers import extract_answer

Reward = Callable[..., Any]


async def _call(reward: Reward, completions: list[str], **row: Any) -> list[float | None]:
    if inspect.iscoroutinefunction(reward) or inspect.iscoroutinefunction(getattr(reward, "__call__", None)):
        return list(await reward(completions, **row))
    return list(await asyncio.to_thread(reward, completions, **row))


class FeedbackReward:
    """`(completions, **row) -> list[float | None]` over a traffic row, from a base reward (compares with a
    reference) and a fallback (needs none).

    >>> reward = FeedbackReward(normalized_match, majority_vote)
    >>> await reward(["\\\\boxed{42}"], answer="42", label="correction")
    [1.0]
    """

    def __init__(self, base: Reward, fallback: Reward):
        self.base = base
        self.fallback = fallback
        self.__name__ = "feedback"

    async def __call__(self, completions: list[str], answer: str | None = None, label: str | None = None,
                       served_answer: str | None = None, **row: Any) -> list[float | None]:
        if answer is not None:
            return await _call(self.base, completions, answer=answer, **row)
        scores = await _call(self.fallback, completions, answer=None, served_answer=served_answer, **row)
        if label == "down" and served_answer:
            same = await _call(self.base, completions, answer=extract_answer(served_answer) or served_answer, **row)
            scores = [0.0 if s == 1.0 else score for s, score in zip(same, scores)]
        return scores
