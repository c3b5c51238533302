"""The model behind the server: any OpenAI-compatible HTTP server, or the embedded model started on loopback.

The embedded model is served by llama-cpp-python's own OpenAI-compatible app in a background thread, so both cases
share one proxy path (streaming included). Servers that ignore `n` are answered by fanning out n requests.

The client is aiohttp rather than httpx: its C HTTP parser halves what the proxy adds per streamed request
(benchmarks/proxy_overhead.py: at 64 streams 0.976x direct with aiohttp against 0.962x with httpx, added p50
8.5 ms against 14.8 ms; with a near-free upstream 0.67x against 0.45x).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any, AsyncIterator

import aiohttp

from server.errors import OpenAIError


class Upstream:
    """One OpenAI-compatible server. The session is made on first use, inside the event loop that serves."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout_s: float = 600.0,
                 supports_n: bool | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model or ""
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, connect=5.0)
        self.supports_n = supports_n  # None: learned from the first non-streaming n > 1 request
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self.headers, timeout=self.timeout,
                                                  connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def start(self) -> None:
        """Learn the model name if none was given; a dead upstream is reported, not fatal (readiness says so)."""
        if not self.model:
            models = await self.models()
            self.model = models[0] if models else "unknown"

    async def models(self) -> list[str]:
        async with self.session.get(f"{self.base_url}/models", timeout=aiohttp.ClientTimeout(total=5)) as reply:
            reply.raise_for_status()
            return [m["id"] for m in (await reply.json()).get("data", [])]

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            async with self.session.post(self.base_url + path, json=body) as reply:
                try:
                    return reply.status, await reply.json(content_type=None)
                except json.JSONDecodeError:
                    raise OpenAIError(502, f"upstream {self.base_url} answered {reply.status} with non-JSON") from None
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
                        payload = OpenAIError(reply.status, text).body()
                    yield {"__status__": reply.status, **payload}
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_embedded(model_file: str | None = None, n_ctx: int = 4096) -> tuple[Upstream, threading.Thread]:
    """Serve the embedded GGUF with llama-cpp-python's OpenAI-compatible app on a loopback port, in this process."""
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    from gym_tf.backends.embedded import DEFAULT_MODEL_NAME, default_model_path

    path = model_file or str(default_model_path())
    alias = DEFAULT_MODEL_NAME if model_file is None else None
    port = free_port()
    app = create_app(server_settings=ServerSettings(host="127.0.0.1", port=port),
                     model_settings=[ModelSettings(model=path, model_alias=alias, n_ctx=n_ctx, verbose=False)])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="embedded-upstream", daemon=True)
    thread.start()
    deadline = time.time() + 120
    while not server.started and thread.is_alive() and time.time() < deadline:
        time.sleep(0.05)
    # llama-cpp-python's server returns one choice whatever `n` says: the proxy fans out instead.
    return Upstream(f"http://127.0.0.1:{port}/v1", model=alias or path, supports_n=False), thread


async def wait_all(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
