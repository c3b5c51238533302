"""Simulated inference engines that behave like vLLM where load balancing cares, behind httpx transports.

Each engine runs up to `batch` sequences at once at a fixed time per token; a request for n samples needs n free
sequence slots and waits in a FIFO queue until it has them, on the engine's own clock. So one engine's capacity is
batch / (tokens x token_s) sequences per second, and requests past it only queue. `down` makes it refuse connections (a killed
replica); `fail_5xx` makes it answer 503.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx


class SimulatedEngine:
    def __init__(self, name: str, batch: int = 16, token_s: float = 0.002, tokens: int = 32):
        self.name, self.batch, self.token_s, self.tokens = name, batch, token_s, tokens
        self.peak = 0  # most sequences running at once
        self.in_flight = 0  # requests received and not yet answered (running or queued): the client's concurrency
        self.peak_in_flight = 0
        self.down = False
        self.fail_5xx = False
        self.completed: list[float] = []  # finish time of every sequence
        self.requests = 0
        # The engine keeps its own clock, as a GPU does: when each of its `batch` sequence slots is next free. A request
        # is admitted, first come first served, at the moment its n slots are free, and finishes a fixed time later,
        # however busy this Python process is. (Waking a coroutine when a slot frees would make the engine wait for the
        # client's event loop: the client's CPU time would be charged to the engine.)
        self._slot_free = [0.0] * batch
        self._last_admit = 0.0

    @property
    def capacity(self) -> float:
        """Sequences per second at full batch."""
        return self.batch / (self.tokens * self.token_s)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def _admit(self, n: int) -> float:
        """Book n slots, first come first served; the time this request finishes."""
        self._slot_free.sort()
        admit = max(time.perf_counter(), self._last_admit, self._slot_free[n - 1])
        finish = admit + self.tokens * self.token_s
        self._slot_free[:n] = [finish] * n
        self._last_admit = admit
        self.peak = max(self.peak, sum(free > admit for free in self._slot_free))
        return finish

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError(f"{self.name} is down", request=request)
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "sim", "object": "model"}]})
        if self.fail_5xx:
            return httpx.Response(503, json={"error": {"message": "overloaded", "type": "server_error"}})
        body = json.loads(request.content)
        n = min(int(body.get("n") or 1), self.batch)
        self.requests += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            finish = self._admit(n)
            await asyncio.sleep(max(0.0, finish - time.perf_counter()))
        finally:
            self.in_flight -= 1
        if self.down:  # killed while this request ran
            raise httpx.RemoteProtocolError(f"{self.name} went away", request=request)
        self.completed.extend([finish] * n)
        return httpx.Response(200, json={
            "id": f"chatcmpl-{self.name}-{self.requests}", "object": "chat.completion", "created": 0, "model": "sim",
            "choices": [{"index": i, "message": {"role": "assistant", "content": f"answer {i} from {self.name}"},
                         "finish_reason": "stop"} for i in range(n)],
            "usage": {"prompt_tokens": 20, "completion_tokens": self.tokens * n, "total_tokens": 20 + self.tokens * n},
        })
