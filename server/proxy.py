"""Forwarding one request: natively, or fanned out to n single-choice requests for upstreams that ignore `n`.

Streams are relayed event by event as they arrive. A fan-out stream merges the n upstream streams, renumbers the
choices, keeps one id / created / model for every chunk, and sums the usage into one chunk. A fan-out runs at most
`upstream.fan_out` of its requests at a time.

`stream_options.include_usage` is honoured whatever the upstream does: the proxy reads the upstream's usage wherever
it comes (its own `choices: []` chunk, or folded into the last choice chunk as llama.cpp's /completions does) and
sends exactly one usage chunk, last. An upstream that reports no usage at all is counted here: one completion token
per content-bearing chunk (how llama.cpp, vLLM and llama-cpp-python stream), prompt tokens unknown (0).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from server.errors import OpenAIError
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
    return {k: sum(v for u in present if isinstance(v := u.get(k), int)) for k in keys}


def _choices(reply: dict[str, Any], upstream: Upstream) -> list[dict[str, Any]]:
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        raise OpenAIError(502, f"upstream {upstream.base_url} answered without choices")
    return choices


async def complete(upstream: Upstream, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A non-streaming request. Fans out when the upstream is known, or found, to ignore `n`."""
    n = body.get("n") or 1
    if n == 1 or upstream.supports_n is False:
        if n == 1:
            return await upstream.post(path, body)
        return await _fan_out(upstream, path, body, n, have=[])
    status, reply = await upstream.post(path, body)
    if status == 400:  # llama.cpp's server refuses n > 1 outright: if single requests go through, it is learned
        status, reply = await _fan_out(upstream, path, body, n, have=[])
        upstream.supports_n = False if status < 400 else None
        return status, reply
    if status >= 400:
        return status, reply
    upstream.supports_n = len(_choices(reply, upstream)) >= n
    if upstream.supports_n:
        return status, reply
    return await _fan_out(upstream, path, body, n, have=[reply])


async def _fan_out(upstream: Upstream, path: str, body: dict[str, Any], n: int, have: list[dict[str, Any]]):
    replies = list(have)
    slots = asyncio.Semaphore(upstream.fan_out)

    async def one(i: int) -> tuple[int, dict[str, Any]]:
        async with slots:
            return await upstream.post(path, _single(body, i))

    results = await asyncio.gather(*(one(i) for i in range(len(have), n)))
    for status, reply in results:
        if status >= 400:
            return status, reply
        replies.append(reply)
    merged = dict(replies[0])
    merged["choices"] = [{**_choices(r, upstream)[0], "index": i} for i, r in enumerate(replies)]
    merged["usage"] = _sum_usage([r.get("usage") for r in replies])
    return 200, merged


def _event(data: str) -> dict[str, Any]:
    """One upstream chunk, checked for the shape the merge relies on (ValueError if not)."""
    event = json.loads(data)
    if not isinstance(event, dict) or not isinstance(event.get("choices", []), list) \
            or not all(isinstance(c, dict) for c in event.get("choices", [])) \
            or not isinstance(event.get("usage") or {}, dict):
        raise ValueError("not a completion chunk")
    return event


def _bad_stream(upstream: Upstream, problem: str) -> dict[str, Any]:
    return {"__status__": 502, **OpenAIError(502, f"upstream {upstream.base_url} sent {problem}").body()}


def _counted(event: dict[str, Any]) -> int:
    """Completion tokens in a chunk from an upstream that reports no usage: one per content-bearing choice."""
    return sum(1 for c in event["choices"]
               if c.get("text") or (isinstance(c.get("delta"), dict) and c["delta"].get("content")))


async def stream(upstream: Upstream, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any] | str | bytes]:
    """What the client gets, in order: the upstream's SSE bytes as they come (one upstream stream and no usage to
    guarantee), or dicts (merged or usage-completed chunks, or an error carrying `__status__`)."""
    n = body.get("n") or 1
    native = n == 1 or upstream.supports_n is True
    wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    if native and not wants_usage:
        async for event in upstream.stream(path, body, raw=True):
            yield event
        return
    bodies = [body] if native else [_single(body, i) for i in range(n)]
    queue: asyncio.Queue = asyncio.Queue()
    slots = asyncio.Semaphore(upstream.fan_out)

    async def pump(i: int) -> None:
        try:
            async with slots:
                async for data in upstream.stream(path, bodies[i]):
                    await queue.put((i, data if isinstance(data, dict) else _event(data)))
        except ValueError as exc:  # an unparsable line, bad bytes, an over-long line: the stream cannot go on
            await queue.put((i, _bad_stream(upstream, f"a bad event ({exc.__class__.__name__})")))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i)) for i in range(len(bodies))]
    identity: dict[str, Any] = {}
    usages: list[dict[str, Any] | None] = [None] * len(bodies)
    counted = [0] * len(bodies)
    finished = 0
    try:
        while finished < len(bodies):
            i, event = await queue.get()
            if event is None:
                finished += 1
                continue
            if "__status__" in event:
                yield event
                return
            identity = identity or {k: event[k] for k in ("id", "created", "model") if k in event}
            usages[i] = event.pop("usage", None) or usages[i]
            if not event.get("choices"):
                continue
            counted[i] += _counted(event)
            choices = event["choices"] if native else [{**c, "index": i} for c in event["choices"]]
            yield {**event, **identity, "choices": choices}
        if wants_usage:
            usage = _sum_usage([u or {"prompt_tokens": 0, "completion_tokens": c, "total_tokens": c}
                                for u, c in zip(usages, counted)])
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
