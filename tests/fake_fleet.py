"""Simulated inference engines that behave like vLLM where load balancing cares, behind httpx transports.

Each engine runs up to `batch` sequences at once at a fixed time per token; a request for n samples needs n free
sequence slots and waits in a FIFO queue until it has them. So one engine's capacity is batch / (tokens x
token_s) sequences per second, and requests past it only queue. `down` makes it refuse connections (a killed
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
        self.running = 0
        self.peak = 0
        self.down = False
        self.fail_5xx = False
        self.completed: list[float] = []  # finish time of every sequence
        self.requests = 0
        self._free = asyncio.Condition()
        self._queue: list[object] = []

    @property
    def capacity(self) -> float:
        """Sequences per second at full batch."""
        return self.batch / (self.tokens * self.token_s)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

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
        ticket = object()
        async with self._free:
            self._queue.append(ticket)  # FIFO: a big request is not starved by small ones
            await self._free.wait_for(lambda: self._queue[0] is ticket and self.running + n <= self.batch)
            self._queue.pop(0)
            self.running += n
            self.peak = max(self.peak, self.running)
            self._free.notify_all()
        try:
            await asyncio.sleep(self.tokens * self.token_s)
            if self.down:  # killed while this request ran
                raise httpx.RemoteProtocolError(f"{self.name} went away", request=request)
        finally:
            async with self._free:
                self.running -= n
                self._free.notify_all()
        now = time.perf_counter()
        self.completed.extend([now] * n)
        return httpx.Response(200, json={
            "id": f"chatcmpl-{self.name}-{self.requests}", "object": "chat.completion", "created": 0, "model": "sim",
            "choices": [{"index": i, "message": {"role": "assistant", "content": f"answer {i} from {self.name}"},
                         "finish_reason": "stop"} for i in range(n)],
            "usage": {"prompt_tokens": 20, "completion_tokens": self.tokens * n, "total_tokens": 20 + self.tokens * n},
        })
