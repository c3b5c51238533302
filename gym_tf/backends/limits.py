"""How many requests one server gets at once: a fixed cap, or one that adapts to what the server sustains.

An inference engine such as vLLM runs up to its batch capacity at about the same speed per token; past it, requests
wait in its queue and only latency grows. So the adaptive limit watches time per completion token, once per window of
`limit` requests. It doubles whenever the median time per token is within `tolerance` of the best seen (slow start, as
TCP does), and otherwise follows the "gradient" rule of Netflix's concurrency-limits:
limit x (tolerance x best / recent) + sqrt(limit). One slow window does not end the doubling for good: at 64 simulated
replicas, the first window's answers waited on gym-tf launching 3,072 groups, and a limit that stopped doubling there
climbed by square roots and was still half its size when the run ended. A 429 or a timeout halves the limit at once
and ends the doubling: that server has said it is full.

The limit serves rollouts, where throughput counts and a queue costs only latency, so `tolerance` is 2: waiting one
batch's time in the queue is not yet "too many". It settles with about one batch queued behind the running one. Less
leaves the engine part-empty whenever its batch finishes at once (equal-length answers): at 1.25, a 16-sequence
engine with G=4 settled at 7 requests, 3 queued behind 4 running, and ran at 0.80 of its capacity
(benchmarks/fleet_throughput.py, 32 and 64 replicas).
"""

from __future__ import annotations

import asyncio
import math


class ConcurrencyLimit:
    """An async context manager: `async with limit:` waits for a slot. `observe()` feeds the adaptive rule."""

    def __init__(self, limit: int, adaptive: bool = False, max_limit: int = 4096, smoothing: float = 0.3,
                 tolerance: float = 2.0):
        self.limit = float(limit)
        self.tolerance = tolerance
        self.slow_start = True
        self.adaptive = adaptive
        self.max_limit = max_limit
        self.smoothing = smoothing
        self.in_flight = 0
        self._changed = asyncio.Condition()
        self._best: float | None = None  # lowest time per token seen: the server unloaded
        self._window: list[float] = []

    async def __aenter__(self) -> "ConcurrencyLimit":
        async with self._changed:
            await self._changed.wait_for(lambda: self.in_flight < int(self.limit))
            self.in_flight += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        async with self._changed:
            self.in_flight -= 1
            self._changed.notify_all()

    def observe(self, latency_s: float, completion_tokens: int) -> None:
        """One finished request: its wall time and the tokens it produced."""
        if not self.adaptive:
            return
        per_token = latency_s / max(1, completion_tokens)
        self._best = per_token if self._best is None else min(self._best, per_token)
        self._window.append(per_token)
        if len(self._window) < max(4, int(self.limit)):
            return
        recent = sorted(self._window)[len(self._window) // 2]  # the median: one slow answer is not a queue
        self._window.clear()
        gradient = min(1.0, max(0.5, self.tolerance * self._best / recent))
        if self.slow_start and gradient >= 1.0:
            self._set(self.limit * 2)
            return
        target = self.limit * gradient + math.sqrt(self.limit)
        self._set((1 - self.smoothing) * self.limit + self.smoothing * target)

    def overloaded(self) -> None:
        """The server said 429 or timed out: back off at once."""
        if self.adaptive:
            self.slow_start = False
            self._window.clear()
            self._set(self.limit / 2)

    def _set(self, value: float) -> None:
        self.limit = min(float(self.max_limit), max(1.0, value))

