"""Several servers of one model as one backend: least outstanding requests, failover, health.

Each request goes to the healthy replica with the fewest requests out relative to its limit. A group's G samples
stay in one request (`n=G`) on one replica, so the engine's prefix sharing keeps working. A replica that cannot be
reached, times out, answers 429 or 5xx is marked down for `cooldown_s` and the request moves to another; after the
cooldown the next request probes it again (nothing polls in the background). When every replica has failed this
request, the fleet waits and tries the round again, `max_rounds` times, before it gives up with the last error.

This is for a handful to dozens of engines that gym-tf addresses directly. In front of hundreds, or when several
clients share the engines, a router that sees every client's load (vLLM's own data-parallel server with one
address, or a router such as vLLM's production-stack router) balances better: give gym-tf its one address.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from gym_tf.backends.base import Generation, Messages
from gym_tf.backends.openai_http import OpenAIBackend
from gym_tf.errors import BackendRequestFailed, BackendUnreachable, GymTFError


@dataclass
class Replica:
    backend: OpenAIBackend
    outstanding: int = 0
    down_until: float = 0.0
    failures: int = 0
    served: int = 0

    def load(self) -> float:
        return self.outstanding / max(1.0, self.backend.slots.limit)


def is_replica_fault(exc: Exception) -> bool:
    """Worth another replica: no connection, a timeout, overload (429) or the server's own error (5xx). Any other
    4xx is the request's fault and would fail anywhere."""
    if isinstance(exc, BackendUnreachable):
        return True
    return isinstance(exc, BackendRequestFailed) and (exc.status is None or exc.status >= 500 or exc.status == 429)


class FleetBackend:
    def __init__(self, replicas: list[OpenAIBackend], cooldown_s: float = 5.0, max_rounds: int = 3,
                 retry_wait_s: float = 1.0):
        if not replicas:
            raise ValueError("a fleet needs at least one replica")
        self.replicas = [Replica(r) for r in replicas]
        self.turn = 0  # ties go round the replicas
        self.cooldown_s = cooldown_s
        self.max_rounds = max_rounds
        self.retry_wait_s = retry_wait_s

    @property
    def model(self) -> str:
        return self.replicas[0].backend.model

    def describe(self) -> str:
        urls = " ".join(r.backend.base_url for r in self.replicas)
        return f"openai-compatible fleet of {len(self.replicas)} ({urls}) model={self.model}"

    async def check(self) -> None:
        """Check every replica; those that fail are marked down. Fails only when none is up."""
        results = await asyncio.gather(*(r.backend.check() for r in self.replicas), return_exceptions=True)
        errors = [e for e in results if isinstance(e, BaseException)]
        if len(errors) == len(results):
            raise errors[0]
        model = next(r.backend.model for r, e in zip(self.replicas, results) if not isinstance(e, BaseException))
        for replica, result in zip(self.replicas, results):
            replica.backend.model = replica.backend.model or model
            if isinstance(result, BaseException):
                self._mark_down(replica)

    async def generate(self, messages: Messages, n: int = 1, **sampling: Any) -> Generation:
        last: Exception | None = None
        for round_ in range(self.max_rounds):
            tried: set[int] = set()
            while len(tried) < len(self.replicas):
                replica = self._pick(tried)
                tried.add(id(replica))
                replica.outstanding += 1
                try:
                    generation = await replica.backend.generate(messages, n, **sampling)
                except GymTFError as exc:
                    if not is_replica_fault(exc):
                        raise
                    last = exc
                    self._mark_down(replica)
                    continue
                finally:
                    replica.outstanding -= 1
                replica.failures, replica.served = 0, replica.served + 1
                return generation
            await asyncio.sleep(self.retry_wait_s * 2**round_)
        assert last is not None
        raise last

    def _pick(self, tried: set[int]) -> Replica:
        now = time.monotonic()
        fresh = [r for r in self.replicas if id(r) not in tried]
        up = [r for r in fresh if r.down_until <= now]
        # All down: probe the one whose cooldown ends first rather than fail while a replica may be back.
        if not up:
            return min(fresh, key=lambda r: r.down_until)
        self.turn += 1
        count = len(self.replicas)
        return min(up, key=lambda r: (r.load(), (self.replicas.index(r) - self.turn) % count))

    def _mark_down(self, replica: Replica) -> None:
        replica.failures += 1
        replica.down_until = time.monotonic() + self.cooldown_s * min(8, replica.failures)

    async def aclose(self) -> None:
        await asyncio.gather(*(r.backend.aclose() for r in self.replicas))
