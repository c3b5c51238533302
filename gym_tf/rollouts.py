"""Group rollouts: G answers per problem from the frozen model, each scored by the reward.

One prompt template serves optimization, evaluation and (through `library_messages`) the server, so the library
always sits in the same place of the prompt.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import inspect
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable

from gym_tf.backends import Backend, Choice, Sampling
from gym_tf.backends.base import gather_or_cancel
from gym_tf.datasets import Problem
from gym_tf.errors import GymTFError, RewardError
from gym_tf.library import EMPTY_LIBRARY, LibraryVersion, library_messages
from gym_tf.prompts import template

logger = logging.getLogger(__name__)


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
    shown: tuple[str, ...] = ()  # the library items this answer's prompt carried


def build_messages(problem: Problem, library: LibraryVersion = EMPTY_LIBRARY, own_example: bool = True
                   ) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The solve prompt and the ids of the items in it: the library's items for this problem (selected by the one
    rule in `select_items`) first in the system message (or, examples shown as turns, before the problem), then the
    task instructions; the problem as user.

    A problem that carries its conversation (recorded traffic, a chat-format dataset) is asked as `serve` asks it:
    those messages, the items selected for their last user message, put first in their system message. Without
    `own_example`, a worked example of this very problem is not shown (`library_messages`)."""
    conversation = problem.conversation  # (fresh copies: nothing done to the prompt reaches the dataset's row)
    if conversation is None:
        conversation = [{"role": "system", "content": template("solve_system")},
                        {"role": "user", "content": problem.problem}]
    return library_messages(library, conversation, None if own_example else problem.problem)


def group_seed(seed: int, *parts: object) -> int:
    """A seed for one group that does not depend on the order or concurrency of the run (stable across resumes)."""
    key = ":".join(str(p) for p in (seed, *parts)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big")


async def score(reward: Callable[..., Any], problem: Problem, completions: list[str],
                time_limit_s: float = 300.0) -> list[float | None]:
    """Run a reward (sync or async) over one group; the dataset row's columns become keyword arguments.

    Every call has a time limit and a logged outcome: past `time_limit_s` the group scores None (no signal), so one
    stuck reward never hangs a run; a reward that raises is a RewardError naming the reward and the problem.
    (math-verify has its own, tighter limit per completion: `rewards.math_answer`.)
    """
    name = getattr(reward, "__name__", type(reward).__name__)
    columns = {**problem.row, "problem": problem.problem, "answer": problem.answer}

    def in_thread() -> asyncio.Future:
        # A thread of its own, so that verifying one group (sympy can take a while) overlaps the next generation,
        # and so that a reward left behind past its limit cannot hold up the event loop's shutdown (the default
        # executor's threads are joined there).
        done: concurrent.futures.Future = concurrent.futures.Future()

        def work() -> None:
            done.set_running_or_notify_cancel()
            try:
                done.set_result(reward(completions, **columns))
            except BaseException as exc:  # handed to the awaiting coroutine, which decides
                done.set_exception(exc)

        threading.Thread(target=work, name=f"reward {name}", daemon=True).start()
        return asyncio.wrap_future(done)

    start = time.perf_counter()
    asynchronous = inspect.iscoroutinefunction(reward) or inspect.iscoroutinefunction(getattr(reward, "__call__", None))
    try:
        result = await asyncio.wait_for(reward(completions, **columns) if asynchronous else in_thread(), time_limit_s)
    except TimeoutError:
        logger.warning("reward %s timed out after %s s on problem %s: no signal for its %d completions",
                       name, time_limit_s, problem.id, len(completions))
        return [None] * len(completions)
    except GymTFError:
        raise
    except Exception as exc:
        raise RewardError(f"reward {name!r} failed on problem {problem.id}: {type(exc).__name__}: {exc}") from exc
    logger.debug("reward %s scored problem %s in %.3f s", name, problem.id, time.perf_counter() - start)
    scores = list(result)
    if len(scores) != len(completions):
        raise RewardError(f"reward returned {len(scores)} scores for {len(completions)} completions")
    return [None if s is None else float(s) for s in scores]


async def rollout_group(
    backend: Backend,
    problem: Problem,
    library: LibraryVersion,
    group_size: int,
    sampling: Sampling,
    reward: Callable[..., Any],
    given: tuple[str, ...] = (),
    own_example: bool = True,
) -> list[Rollout]:
    """Sample `group_size` answers in one request (servers that share the prefix) and score them. Answers `given`
    in advance (a served answer a user gave feedback on) take the group's last places and are scored with it."""
    messages, shown = build_messages(problem, library, own_example)
    start = time.perf_counter()
    generation = await backend.generate(messages, n=group_size - len(given), **sampling.__dict__)
    elapsed = time.perf_counter() - start
    sampled = len(generation.choices)
    choices = [*generation.choices, *(Choice(text=text, finish_reason="stop", completion_tokens=0) for text in given)]
    texts = [c.text for c in choices]
    rewards = await score(reward, problem, texts)
    share = generation.prompt_tokens // max(1, sampled)
    return [
        Rollout(
            problem_id=problem.id,
            sample=i,
            messages=messages,
            completion=choice.text,
            finish_reason=choice.finish_reason,
            prompt_tokens=0 if i >= sampled else share if i else generation.prompt_tokens - share * (sampled - 1),
            completion_tokens=choice.completion_tokens,
            latency_s=elapsed if i < sampled else 0.0,
            reward=r,
            library_version=library.id if i < sampled else "served",
            shown=shown if i < sampled else (),
        )
        for i, (choice, r) in enumerate(zip(choices, rewards))
    ]


async def rollout_many(
    backend: Backend,
    problems: list[Problem],
    library: LibraryVersion,
    group_size: int,
    sampling: Sampling,
    reward: Callable[..., Any],
    seed: int,
    seed_key: object = "",
    on_group: Callable[[Problem, list[Rollout]], Awaitable[None] | None] | None = None,
    given: Callable[[Problem], tuple[str, ...]] = lambda problem: (),
    own_example: bool = True,
) -> dict[str, list[Rollout]]:
    """Roll out every problem's group concurrently (the backend caps what runs at once).

    `on_group` sees each group as soon as it is scored, so the caller can store it before the batch ends; `given`
    names answers that join a problem's group without being sampled; `own_example=False`: no problem is shown a
    worked example of itself.
    """

    async def one(problem: Problem) -> tuple[str, list[Rollout]]:
        params = replace(sampling, seed=group_seed(seed, seed_key, problem.id))
        group = await rollout_group(backend, problem, library, group_size, params, reward, given(problem),
                                    own_example)
        if on_group is not None:
            maybe = on_group(problem, group)
            if inspect.isawaitable(maybe):
                await maybe
        return problem.id, group

    return dict(await gather_or_cancel(*(one(p) for p in problems)))

