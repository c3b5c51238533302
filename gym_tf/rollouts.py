"""Group rollouts: G answers per problem from the frozen model, each scored by the reward.

One prompt template serves optimization, evaluation and (through `with_library`) the server, so the library
always sits in the same place of the prompt.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable

from gym_tf.backends import Backend, Sampling
from gym_tf.datasets import Problem
from gym_tf.errors import RewardError
from gym_tf.library import with_library
from gym_tf.prompts import template


@dataclass(frozen=True)
class Rollout:
    """One sampled answer to one problem, and what it cost."""

    problem_id: str
    sample: int
    messages: list[dict[str, Any]]
    completion: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    reward: float | None = None
    library_version: str = ""


def build_messages(problem: Problem, library_text: str) -> list[dict[str, Any]]:
    """The solve prompt: the library first in the system message, then the task instructions; the problem as user."""
    base = [{"role": "system", "content": template("solve_system")}, {"role": "user", "content": problem.problem}]
    return with_library(base, library_text)


def group_seed(seed: int, *parts: object) -> int:
    """A seed for one group that does not depend on the order or concurrency of the run (stable across resumes)."""
    key = ":".join(str(p) for p in (seed, *parts)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big")


async def score(reward: Callable[..., Any], problem: Problem, completions: list[str]) -> list[float | None]:
    """Run a reward (sync or async) over one group; the dataset row's columns become keyword arguments."""
    columns = {**problem.row, "problem": problem.problem, "answer": problem.answer}
    try:
        if inspect.iscoroutinefunction(reward) or inspect.iscoroutinefunction(getattr(reward, "__call__", None)):
            result = await reward(completions, **columns)
        else:
            # In a worker thread, so that verifying one group (sympy can take a while) overlaps the next generation.
            result = await asyncio.to_thread(reward, completions, **columns)
    except TypeError as exc:
        raise RewardError(f"reward {getattr(reward, '__name__', reward)!r} failed on problem {problem.id}: {exc}") from None
    scores = list(result)
    if len(scores) != len(completions):
        raise RewardError(f"reward returned {len(scores)} scores for {len(completions)} completions")
    return [None if s is None else float(s) for s in scores]


async def rollout_group(
    backend: Backend,
    problem: Problem,
    library_text: str,
    group_size: int,
    sampling: Sampling,
    reward: Callable[..., Any],
    library_version: str = "",
) -> list[Rollout]:
    """Sample `group_size` answers in one request (servers that share the prefix) and score them."""
    messages = build_messages(problem, library_text)
    start = time.perf_counter()
    generation = await backend.generate(messages, n=group_size, **sampling.__dict__)
    elapsed = time.perf_counter() - start
    texts = [c.text for c in generation.choices]
    rewards = await score(reward, problem, texts)
    share = generation.prompt_tokens // max(1, len(texts))
    return [
        Rollout(
            problem_id=problem.id,
            sample=i,
            messages=messages,
            completion=choice.text,
            finish_reason=choice.finish_reason,
            prompt_tokens=share if i else generation.prompt_tokens - share * (len(texts) - 1),
            completion_tokens=choice.completion_tokens,
            latency_s=elapsed,
            reward=r,
            library_version=library_version,
        )
        for i, (choice, r) in enumerate(zip(generation.choices, rewards))
    ]


async def rollout_many(
    backend: Backend,
    problems: list[Problem],
    library_text: str,
    group_size: int,
    sampling: Sampling,
    reward: Callable[..., Any],
    seed: int,
    seed_key: object = "",
    library_version: str = "",
    on_group: Callable[[Problem, list[Rollout]], Awaitable[None] | None] | None = None,
) -> dict[str, list[Rollout]]:
    """Roll out every problem's group concurrently (the backend caps what runs at once).

    `on_group` sees each group as soon as it is scored, so the caller can store it before the batch ends.
    """

    async def one(problem: Problem) -> tuple[str, list[Rollout]]:
        params = replace(sampling, seed=group_seed(seed, seed_key, problem.id))
        group = await rollout_group(backend, problem, library_text, group_size, params, reward, library_version)
        if on_group is not None:
            maybe = on_group(problem, group)
            if inspect.isawaitable(maybe):
                await maybe
        return problem.id, group

    return dict(await asyncio.gather(*(one(p) for p in problems)))
