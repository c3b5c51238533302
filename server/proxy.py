"""Forwarding one request: natively, or fanned out to n single-choice requests for upstreams that ignore `n`.

Streams are relayed event by event as they arrive. A fan-out stream merges the n upstream streams, renumbers the
choices, keeps one id / created / model for every chunk, and sums the usage chunks into one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from server.upstream import Upstream, wait_all


def sse(event: dict[str, Any] | str) -> bytes:
    return f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n".encode()


def _single(body: dict[str, Any], i: int) -> dict[str, Any]:
    one = {**body, "n": 1}
    if body.get("seed") is not None:
        one["seed"] = body["seed"] + i  # distinct samples, still reproducible
    return one


def _sum_usage(usages: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    present = [u for u in usages if u]
    if not present:
        return None
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    return {k: sum(u.get(k) or 0 for u in present) for k in keys}


async def complete(upstream: Upstream, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A non-streaming request. Fans out when the upstream is known, or found, to ignore `n`."""
    n = body.get("n") or 1
    if n == 1 or upstream.supports_n is False:
        if n == 1:
            return await upstream.post(path, body)
        return await _fan_out(upstream, path, body, n, have=[])
    status, reply = await upstream.post(path, body)
    if status >= 400:
        return status, reply
    choices = reply.get("choices", [])
    upstream.supports_n = len(choices) >= n
    if upstream.supports_n:
        return status, reply
    return await _fan_out(upstream, path, body, n, have=[reply])


async def _fan_out(upstream: Upstream, path: str, body: dict[str, Any], n: int, have: list[dict[str, Any]]):
    replies = list(have)
    results = await asyncio.gather(*(upstream.post(path, _single(body, i)) for i in range(len(have), n)))
    for status, reply in results:
        if status >= 400:
            return status, reply
        replies.append(reply)
    merged = dict(replies[0])
    merged["choices"] = [{**r["choices"][0], "index": i} for i, r in enumerate(replies)]
    merged["usage"] = _sum_usage([r.get("usage") for r in replies])
    return 200, merged


async def stream(upstream: Upstream, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any] | str]:
    """What the client gets, in order: the upstream's SSE bytes as they come (one choice, or an upstream that
    honours n), or dicts (renumbered fan-out chunks, or an error carrying `__status__`)."""
    n = body.get("n") or 1
    if n == 1 or upstream.supports_n is True:
        async for event in upstream.stream(path, body, raw=True):
            yield event
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int) -> None:
        async for event in upstream.stream(path, _single(body, i)):
            await queue.put((i, json.loads(event) if isinstance(event, str) else event))
        await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i)) for i in range(n)]
    identity: dict[str, Any] = {}
    usages: list[dict[str, Any] | None] = []
    finished = 0
    try:
        while finished < n:
            i, event = await queue.get()
            if event is None:
                finished += 1
                continue
            if "__status__" in event:
                yield event
                return
            identity = identity or {k: event[k] for k in ("id", "created", "model") if k in event}
            if not event.get("choices"):
                usages.append(event.get("usage"))
                continue
            yield {**event, **identity, "choices": [{**c, "index": i} for c in event["choices"]]}
        usage = _sum_usage(usages)
        if usage is not None:
            yield {**identity, "object": "chat.completion.chunk" if "chat" in path else "text_completion",
                   "choices": [], "usage": usage}
    finally:
        await wait_all(tasks)


async def relay(events: AsyncIterator[dict[str, Any] | bytes], on_usage) -> AsyncIterator[bytes]:
    """SSE bytes for the client. An upstream failure ends the stream with an error event (never a hang).

    Upstream bytes pass through untouched (their own [DONE] included); only a chunk that mentions usage is split
    into events and read, for the token metrics."""
    raw = False
    async for event in events:
        if isinstance(event, bytes):
            raw = True
            if b'"usage"' in event:
                _count_usage(event, on_usage)
            yield event
            continue
        if "__status__" in event:
            event.pop("__status__")
            yield sse(event)
            return
        if event.get("usage"):
            on_usage(event["usage"])
        yield sse(event)
    if not raw:
        yield sse("[DONE]")


def _count_usage(chunk: bytes, on_usage) -> None:
    for line in chunk.split(b"\n"):
        if line.startswith(b"data:") and b'"usage"' in line:
            try:
                usage = json.loads(line[5:]).get("usage")
            except json.JSONDecodeError:
                continue  # an event split across network chunks: its usage goes uncounted, the client still gets it
            if usage:
                on_usage(usage)
