"""The model behind the server: any OpenAI-compatible HTTP server, or the embedded model started on loopback.

The embedded model is served by llama.cpp's own OpenAI-compatible server (xllamacpp) on loopback, in this process,
so both cases share one proxy path (streaming included). Servers that ignore `n` are answered by fanning out n requests.

The client is aiohttp rather than httpx: its C HTTP parser halves what the proxy adds per streamed request
(benchmarks/proxy_overhead.py: at 64 streams 0.976x direct with aiohttp against 0.962x with httpx, added p50
8.5 ms against 14.8 ms; with a near-free upstream 0.67x against 0.45x).
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp

from server.errors import OpenAIError


class Upstream:
    """One OpenAI-compatible server. The session is made on first use, inside the event loop that serves."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout_s: float = 600.0,
                 supports_n: bool | None = None, fan_out: int = 8, max_connections: int = 1024):
        self.base_url = base_url.rstrip("/")
        self.model = model or ""
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, connect=5.0)
        self.supports_n = supports_n  # None: learned from the first non-streaming n > 1 request
        self.fan_out = fan_out  # requests of one fanned-out request in flight at a time
        self.max_connections = max_connections  # to the upstream, over all requests
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self.headers, timeout=self.timeout,
                                                  connector=aiohttp.TCPConnector(limit=self.max_connections))
        return self._session

    async def model_name(self) -> str:
        """The model to ask for: the one given, else the upstream's first, learned on first need. An upstream that
        is down at start-up is asked again by the next request, instead of leaving the name empty for good."""
        if not self.model:
            try:
                models = await self.models()
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
                raise OpenAIError(502, f"upstream {self.base_url} is unreachable: {exc.__class__.__name__}") from None
            self.model = models[0] if models else "unknown"
        return self.model

    async def models(self) -> list[str]:
        async with self.session.get(f"{self.base_url}/models", timeout=aiohttp.ClientTimeout(total=5)) as reply:
            reply.raise_for_status()
            return [m["id"] for m in (await reply.json()).get("data", [])]

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            async with self.session.post(self.base_url + path, json=body) as reply:
                try:
                    payload = await reply.json(content_type=None)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    payload = None
                if not isinstance(payload, dict):
                    raise OpenAIError(502, f"upstream {self.base_url} answered {reply.status} without a JSON object")
                return reply.status, payload
        except asyncio.TimeoutError:
            raise OpenAIError(504, f"upstream {self.base_url} timed out") from None
        except aiohttp.ClientError as exc:
            raise OpenAIError(502, f"upstream {self.base_url} is unreachable: {exc.__class__.__name__}: {exc}") from None

    async def stream(self, path: str, body: dict[str, Any], raw: bool = False) -> AsyncIterator[dict[str, Any] | str | bytes]:
        """Relay an SSE response as it arrives: with `raw`, the upstream's bytes untouched (the fast path: no line
        splitting, no parsing); otherwise each event's data, unparsed, without the final [DONE]. A refusal, or a
        failure mid-stream, arrives as an error dict carrying `__status__`."""
        try:
            async with self.session.post(self.base_url + path, json=body) as reply:
                if reply.status >= 400:
                    text = await reply.text()
                    try:
                        payload = json.loads(text)
                    except json.JSONDecodeError:
                        payload = None
                    if not isinstance(payload, dict):
                        payload = OpenAIError(reply.status, text).body()
                    yield {"__status__": reply.status, **payload}
                    return
                if reply.content_type != "text/event-stream":
                    # a 200 that is not an event stream (a captive portal's HTML page) was relayed to the client as
                    # its stream, before (found by tests/test_attack_faults.py)
                    yield {"__status__": 502, **OpenAIError(502, f"upstream {self.base_url} answered a stream "
                                                                 f"request with {reply.content_type or 'no content type'}, "
                                                                 "not an event stream").body()}
                    return
                if raw:
                    async for chunk in reply.content.iter_any():
                        yield chunk
                    return
                async for line in reply.content:
                    line = line.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    yield data
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            yield {"__status__": 502, **OpenAIError(502, f"upstream {self.base_url} failed mid-stream: "
                                                   f"{exc.__class__.__name__}").body()}

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()



class UpstreamPool:
    """Several replicas of one model behind one `Upstream` interface: each request goes to the healthy replica with
    the fewest requests out; a replica that cannot be reached, times out or answers 5xx is left for `cooldown_s`
    and the request tries the next one. A stream moves only before its first byte: once the client has part of
    an answer, a failure ends that stream with an error event, as with one upstream."""

    def __init__(self, members: list[Upstream], cooldown_s: float = 5.0):
        self.members = members
        self.cooldown_s = cooldown_s
        self.outstanding = {id(m): 0 for m in members}
        self.down_until = {id(m): 0.0 for m in members}
        self.turn = 0  # ties go round the replicas
        self.fan_out = members[0].fan_out
        self.supports_n: bool | None = members[0].supports_n  # one model, one server kind: learned once for all

    @property
    def base_url(self) -> str:
        return " ".join(m.base_url for m in self.members)

    @property
    def model(self) -> str:
        return next((m.model for m in self.members if m.model), "")

    async def model_name(self) -> str:
        if self.model:
            return self.model
        last: OpenAIError | None = None
        for member in self._order():
            try:
                name = await member.model_name()
            except OpenAIError as exc:
                last = exc
                self._down(member)
                continue
            for other in self.members:
                other.model = other.model or name
            return name
        raise last or OpenAIError(502, "no upstream")

    async def models(self) -> list[str]:
        last: Exception | None = None
        for member in self._order():
            try:
                return await member.models()
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                last = exc
                self._down(member)
        raise last or aiohttp.ClientError("no upstream")

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        last: OpenAIError | None = None
        for member in self._order():
            self.outstanding[id(member)] += 1
            try:
                status, payload = await member.post(path, body)
            except OpenAIError as exc:  # unreachable or timed out
                last = exc
                self._down(member)
                continue
            finally:
                self.outstanding[id(member)] -= 1
            if status >= 500:
                self._down(member)
                last = OpenAIError(status, f"upstream {member.base_url} answered {status}")
                continue
            return status, payload
        assert last is not None
        raise last

    async def stream(self, path: str, body: dict[str, Any], raw: bool = False) -> AsyncIterator[dict[str, Any] | str | bytes]:
        order = self._order()
        for attempt, member in enumerate(order):
            self.outstanding[id(member)] += 1
            try:
                started = False
                async for item in member.stream(path, body, raw):
                    failed = isinstance(item, dict) and item.get("__status__", 0) >= 500
                    if not started and failed and attempt + 1 < len(order):
                        self._down(member)
                        break  # nothing sent yet: the next replica
                    started = True
                    yield item
                else:
                    return
                if started:
                    return
            finally:
                self.outstanding[id(member)] -= 1

    def _order(self) -> list[Upstream]:
        """Healthy replicas by fewest requests out, then the ones cooling down, soonest back first."""
        now = asyncio.get_running_loop().time()
        self.turn += 1
        count = len(self.members)
        up = sorted((m for m in self.members if self.down_until[id(m)] <= now),
                    key=lambda m: (self.outstanding[id(m)], (self.members.index(m) - self.turn) % count))
        down = sorted((m for m in self.members if self.down_until[id(m)] > now), key=lambda m: self.down_until[id(m)])
        return up + down

    def _down(self, member: Upstream) -> None:
        self.down_until[id(member)] = asyncio.get_running_loop().time() + self.cooldown_s

    async def aclose(self) -> None:
        await asyncio.gather(*(m.aclose() for m in self.members))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_embedded(model_file: str | None = None, n_ctx: int = 4096) -> tuple[Upstream, Any]:
    """Serve the embedded GGUF with llama.cpp's own OpenAI-compatible server (xllamacpp) on a loopback port, in
    this process. The returned server object must be kept alive for as long as the upstream is used. Its `SLOTS`
    slots decode concurrent requests (and the proxy's fan-out of one request's `n`) together in one batch; a request
    beyond them waits for a slot."""
    import xllamacpp

    from gym_tf.backends.embedded import DEFAULT_MODEL_NAME, SLOTS, check_engine, default_model_path, server_params

    check_engine()
    path = Path(model_file) if model_file else default_model_path()
    alias = DEFAULT_MODEL_NAME if model_file is None else path.stem
    params = server_params(path, n_ctx, threads=None, port=free_port(), slots=SLOTS)
    params.model_alias = {alias}  # a set in llama.cpp's params: a plain string would become its letters
    server = xllamacpp.Server(params)
    # The proxy fans n out: llama.cpp's server refuses n > 1 on one slot, and with several its usage counts the first
    # choice alone.
    return Upstream(f"{server.listening_address}/v1", model=alias, supports_n=False), server


async def wait_all(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
