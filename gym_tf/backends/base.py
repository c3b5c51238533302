"""The one seam between gym-tf and a model: `Backend.generate(messages, n, **sampling) -> Generation`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Protocol

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters for one request. `json_schema` constrains decoding where the backend can."""

    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    json_schema: dict[str, Any] | None = field(default=None, hash=False)


@dataclass(frozen=True)
class Choice:
    text: str
    finish_reason: str | None
    completion_tokens: int


@dataclass(frozen=True)
class Generation:
    """The n choices for one prompt, with the token usage the backend reported and the wall time it took."""

    choices: list[Choice]
    prompt_tokens: int
    completion_tokens: int
    latency_s: float

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Backend(Protocol):
    """A frozen model. `model` names it in reports; `describe()` is one line for humans."""

    model: str

    async def generate(self, messages: Messages, n: int = 1, **sampling: Any) -> Generation: ...

    def describe(self) -> str: ...

    async def aclose(self) -> None: ...


def split_tokens(total: int, n: int) -> list[int]:
    """Share a usage total reported for n choices among them so that the parts add up to the total."""
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


async def gather_or_cancel(*work: Awaitable[Any]) -> list[Any]:
    """`asyncio.gather`, except that the first failure cancels the rest and waits for them: with plain gather the
    others went on paying for calls whose results could no longer be stored, and their own failures were printed
    as "Task exception was never retrieved" tracebacks under the CLI's one-line error (tests/test_attack_faults.py)."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
