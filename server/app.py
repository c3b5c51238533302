"""The FastAPI app: thin routes over the proxy, the library registry, auth, limits, health and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.exceptions import HTTPException

from gym_tf.errors import UnknownVersion
from gym_tf.library import EMPTY_LIBRARY, LibraryVersion, library_messages, render_library, short, with_policy
from gym_tf.store import RunStore
from gym_tf.studio import StudioConfig, create_studio, favicon
from gym_tf.tenants import may_serve
from gym_tf.traffic import DEFAULT_TENANT, key_id
from server import feedback, proxy, schema
from server.errors import OpenAIError
from server.recording import Recorder, relay_onto
from server.upstream import Upstream

if TYPE_CHECKING:
    from server.follow import Follower

LIBRARY_HEADER = "x-gym-tf-library"           # request: pin a version
VERSION_HEADER = "x-gym-tf-library-version"   # response: the version that answered
STUDIO_PATH = "/ui"


@dataclass
class ServerConfig:
    api_keys: list[str] = field(default_factory=list)
    max_body_bytes: int = 4 * 1024 * 1024
    max_library_tokens: int | None = None  # None: each version's own recorded cap, as its run rendered it
    max_n: int = 128  # OpenAI's own cap; a fan-out upstream gets at most this many requests per request
    admin_keys: list[str] = field(default_factory=list)  # also API keys; they alone may act in the studio
    studio: bool = True  # the studio's pages under /ui (they check the same keys themselves)
    tenants: dict[str, str] = field(default_factory=dict)  # API key -> tenant (gym_tf.tenants); others: default


class LibraryRegistry:
    """Which library answers a request: a pinned one (`model@version` or the header), else the store's served one.

    The served pointer is read per request, so `gym-tf library promote` takes effect without a restart; a request
    keeps the version it resolved at its start until it ends. A pin is a full id or a prefix that names one version
    now; a version its run's gate rejected is served only when pinned by its full id. Rendered texts are cached by
    full id, so a prefix is looked up again each time (a new version can make it ambiguous).
    """

    def __init__(self, store: RunStore, max_tokens: int | None):
        self.store = store
        self.max_tokens = max_tokens
        self._versions = {"empty": EMPTY_LIBRARY}
        self._rendering: dict[str, LibraryVersion] = {}
        self._owned: dict[tuple[str, str], bool] = {}

    def resolve(self, pinned: str | None, tenant: str = DEFAULT_TENANT) -> LibraryVersion:
        """The recorded version answering a request (its id is what responses report and pins name). A tenant is
        served its own line only: its own pointer (none: the empty library), and pins of its own versions."""
        ref = pinned or self.store.served_version_id(tenant) or "empty"
        if ref in self._versions and self.owned(self._versions[ref].id, tenant):
            return self._versions[ref]
        try:
            version = self.store.version(ref)
        except UnknownVersion as exc:
            raise OpenAIError(404, f"unknown library version: {exc}", code="library_not_found") from None
        if not self.owned(version.id, tenant):  # the same answer as for a version that does not exist
            raise OpenAIError(404, f"unknown library version: no library version {ref!r}", code="library_not_found")
        if ref != version.id and self.store.version_row(version.id)["status"] == "rejected":
            raise OpenAIError(404, f"library version {ref!r} was rejected by its run; pin its full id to serve it",
                              code="library_not_found")
        self._versions.setdefault(version.id, version)
        return version

    def owned(self, version_id: str, tenant: str) -> bool:
        """Whether a tenant may be served a version (cached: a version's owner never changes)."""
        key = (version_id, tenant)
        if key not in self._owned:
            self._owned[key] = may_serve(self.store, version_id, tenant)
        return self._owned[key]

    def text(self, version: LibraryVersion, query: str) -> str:
        """The library text for a request: the items `select_items` picks for its text, as in optimize and eval,
        under the version's own render policy, or the server's cap when one was set."""
        return render_library(self._rendered(version), query)

    def messages(self, version: LibraryVersion, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A chat request's messages with the library in them, as optimize and eval send them (`library_messages`)."""
        return library_messages(self._rendered(version), messages)[0]

    def _rendered(self, version: LibraryVersion) -> LibraryVersion:
        if version.id not in self._rendering:
            capped = version.policy.model_copy(update={"max_tokens": self.max_tokens}) if self.max_tokens else None
            self._rendering[version.id] = with_policy(version, capped)
        return self._rendering[version.id]


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("gym_tf_requests", "Requests by route and status", ["route", "status"], registry=self.registry)
        self.latency = Histogram("gym_tf_request_seconds", "Time to the full response (or stream end)", ["route"],
                                 registry=self.registry)
        self.tokens = Counter("gym_tf_tokens", "Tokens reported by the upstream", ["kind"], registry=self.registry)
        self.served = Gauge("gym_tf_library_served", "1 for the library version answering unpinned requests",
                            ["version"], registry=self.registry)

    def usage(self, usage: dict[str, Any] | None) -> None:
        for kind in ("prompt_tokens", "completion_tokens"):
            if usage and usage.get(kind):
                self.tokens.labels(kind.removesuffix("_tokens")).inc(usage[kind])


def split_model(model: str | None) -> str | None:
    """`name@version` pins a version; the name itself is replaced by the upstream's model."""
    if model and "@" in model:
        return model.rsplit("@", 1)[1]
    return None


def create_app(upstream: Upstream, store: RunStore, config: ServerConfig | None = None,
               recorder: Recorder | None = None, *, follower: Follower | None = None) -> FastAPI:
    """The app. With a `recorder` (server.recording), every answered request is recorded and feedback is taken;
    with a `follower`, this server is a replica serving what its primary serves (server.follow)."""
    config = config or ServerConfig()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        with contextlib.suppress(OpenAIError):
            await upstream.model_name()  # a dead upstream is not fatal: readiness says so, the next request asks again
        following = asyncio.create_task(follower.run()) if follower else None
        yield
        if following:
            following.cancel()
            await follower.aclose()
        await upstream.aclose()
        if recorder is not None:
            recorder.close()

    app = FastAPI(title="gym-tf", docs_url=None, redoc_url=None, lifespan=lifespan)
    registry = LibraryRegistry(store, config.max_library_tokens)
    metrics = Metrics()
    app.state.upstream, app.state.registry, app.state.metrics = upstream, registry, metrics

    app.add_middleware(Guard, config=config)
    if config.studio:
        app.mount(STUDIO_PATH, create_studio(store, StudioConfig(config.api_keys, config.admin_keys)))
        app.add_route("/favicon.ico", favicon)
    feedback.register(app, recorder, _json_body)

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, exc: OpenAIError):
        metrics.requests.labels(request.url.path, str(exc.status)).inc()
        version = getattr(request.state, "library_version", None)  # set once a request has chosen its version
        return exc.response({VERSION_HEADER: version} if version else None)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # unknown paths and methods, in the same shape
        return OpenAIError(exc.status_code, str(exc.detail)).response(exc.headers)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/health/ready")
    async def ready():
        problems = []
        try:
            await upstream.models()
        except Exception as exc:  # noqa: BLE001 - any failure means not ready; the reason is reported
            problems.append(f"upstream {upstream.base_url}: {exc.__class__.__name__}")
        try:
            version = registry.resolve(None)
        except OpenAIError as exc:
            problems.append(exc.message)
            version = None
        body = {"status": "ready" if not problems else "not ready", "problems": problems,
                "library": version.id if version else None, "model": upstream.model}
        return JSONResponse(body, status_code=200 if not problems else 503)

    @app.get("/v1/library")
    async def served_library():
        """What this server answers with, and where its signed manifest is: what replicas follow."""
        version = registry.resolve(None)
        published = store.db.conn.execute(
            "select manifest from publications where version_id = ? and direction = 'out' order by created desc "
            "limit 1", [version.id]).fetchone()
        return {"version": version.id, "manifest": published[0] if published else None}

    @app.get("/metrics")
    async def prometheus():
        served = registry.resolve(None)
        metrics.served.clear()
        metrics.served.labels(served.id).set(1)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        now, model = int(time.time()), await upstream.model_name()
        tenant = _tenant(request)
        ids = [model] + [f"{model}@{short(v['id'])}" for v in store.versions()
                         if v["status"] in ("promoted", "imported") and v["id"] != EMPTY_LIBRARY.id
                         and registry.owned(v["id"], tenant)]
        return {"object": "list", "data": [{"id": i, "object": "model", "created": now, "owned_by": "gym-tf"} for i in ids]}

    @app.post("/v1/chat/completions", openapi_extra=schema.operation(schema.CHAT_REQUEST))
    async def chat(request: Request):
        body = await _json_body(request, config.max_body_bytes)
        version = _version(request, body)
        _check(body, config.max_n, chat=True)
        asked, body = body, {**body, "model": await upstream.model_name(),
                             "messages": registry.messages(version, body["messages"])}
        return await _forward(request, "/chat/completions", body, version, asked)

    @app.post("/v1/completions", openapi_extra=schema.operation(schema.COMPLETION_REQUEST))
    async def completions(request: Request):
        body = await _json_body(request, config.max_body_bytes)
        version = _version(request, body)
        _check(body, config.max_n, chat=False)
        prompt = body.get("prompt")
        text = registry.text(version, prompt if isinstance(prompt, str) else "")
        asked, body = body, {**body, "model": await upstream.model_name(), "prompt": _inject_prompt(body.get("prompt"), text)}
        return await _forward(request, "/completions", body, version, asked)

    def _version(request: Request, body: dict[str, Any]) -> LibraryVersion:
        if not isinstance(body.get("model", ""), str):
            raise OpenAIError(400, "model must be a string", param="model")
        version = registry.resolve(split_model(body.get("model")) or request.headers.get(LIBRARY_HEADER), _tenant(request))
        request.state.library_version = version.id
        return version

    async def _forward(request: Request, path: str, body: dict[str, Any], version: LibraryVersion,
                       asked: dict[str, Any]):
        headers = {VERSION_HEADER: version.id}
        start = time.perf_counter()
        # what a recorded exchange needs from the request path; the recorder's writer process does the rest
        meta = {"tenant": _tenant(request), "created": time.time(), "route": path, "model": body["model"],
                "library_version": version.id, "request": asked} if recorder and recorder.active() else None
        if body.get("stream"):
            def finished() -> None:
                metrics.latency.labels(path).observe(time.perf_counter() - start)
                metrics.requests.labels(path, "200").inc()

            events = relay_onto(proxy.relay(proxy.stream(upstream, path, body), metrics.usage),
                                recorder.tape(meta, start) if meta else None, finished)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        status, reply = await _unless_disconnected(request, proxy.complete(upstream, path, body))
        metrics.latency.labels(path).observe(time.perf_counter() - start)
        metrics.requests.labels(path, str(status)).inc()
        if status < 400:
            metrics.usage(reply.get("usage"))
            if meta:
                recorder.completed(meta, reply, time.perf_counter() - start)
        return JSONResponse(reply, status_code=status, headers=headers)

    return app


def _tenant(request: Request) -> str:
    return (request.scope.get("state") or {}).get("tenant", DEFAULT_TENANT)


class Guard:
    """API keys and the declared body size limit, as plain ASGI: Starlette's BaseHTTPMiddleware would sit in
    every streamed chunk's path (measured in benchmarks/proxy_overhead.py). The key that matched names the
    request's tenant (`scope["state"]["tenant"]`) and, as a digest, who gave feedback (`key_id`)."""

    def __init__(self, app, config: ServerConfig):
        self.app = app
        self.config = config

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            length = headers.get("content-length", "")
            error = None
            # everything but the bare liveness probe: readiness names the upstream, metrics and the schema tell a lot;
            # the studio checks the same keys itself (a browser sends them as a cookie)
            studio = self.config.studio and ((scope["path"] + "/").startswith(STUDIO_PATH + "/")
                                             or scope["path"] == "/favicon.ico")
            keys = self.config.api_keys + self.config.admin_keys
            key = _authorized(headers.get("authorization", ""), keys) if keys else ""
            if self.config.api_keys and scope["path"] != "/health" and not studio and key is None:
                error = OpenAIError(401, "invalid or missing API key", code="invalid_api_key")
            elif length.isdigit() and int(length) > self.config.max_body_bytes:
                error = OpenAIError(413, f"request body over {self.config.max_body_bytes} bytes")
            if error is not None:
                await error.response()(scope, receive, send)
                return
            state = scope.setdefault("state", {})
            state["tenant"] = self.config.tenants.get(key or "", DEFAULT_TENANT)
            state["key_id"] = key_id(key) if key else "anonymous"
        await self.app(scope, receive, send)


def _authorized(header: str, keys: list[str]) -> str | None:
    """The key the header carries, if it is one of `keys`; else None."""
    scheme, _, token = header.partition(" ")
    # compare against every key, so the time taken does not reveal which one (if any) matched
    matches = [hmac.compare_digest(token.encode(), key.encode()) for key in keys]
    return keys[matches.index(True)] if scheme.lower() == "bearer" and any(matches) else None


MAX_JSON_DEPTH = 512
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]")


def _nesting(raw: bytes | bytearray) -> int:
    """How deep the body's arrays and objects nest, found before parsing: the json module's C parser recurses once
    per level, and a body of 100,000 `[` overflowed a server thread's C stack (a segfault, seen in the hostile
    tests) before Python's recursion limit could raise. Bodies with few brackets are not scanned."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return 0
    depth = deepest = 0
    for bracket in _NOT_BRACKET.sub(b"", _JSON_STRING.sub(b'""', bytes(raw))):
        depth += 1 if bracket in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


async def _json_body(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, read chunk by chunk: a chunked body over the limit is refused as soon as it passes
    it, never buffered whole."""
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise OpenAIError(413, f"request body over {limit} bytes")
    if await asyncio.to_thread(_nesting, raw) > MAX_JSON_DEPTH:
        raise OpenAIError(400, f"request body is nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise OpenAIError(400, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise OpenAIError(400, "request body is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    return body


def _check(body: dict[str, Any], max_n: int, chat: bool) -> None:
    """The fields the proxy itself reads must have their OpenAI types; everything else is the upstream's to judge."""
    messages = body.get("messages")
    if chat and (not isinstance(messages, list)
                 or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
        raise OpenAIError(400, "messages must be a list of objects, each with a string role", param="messages")
    n = body.get("n")
    if n is not None and (type(n) is not int or not 1 <= n <= max_n):
        raise OpenAIError(400, f"n must be an integer from 1 to {max_n}", param="n")
    if body.get("seed") is not None and type(body["seed"]) is not int:
        raise OpenAIError(400, "seed must be an integer", param="seed")
    if not isinstance(body.get("stream_options") or {}, dict):
        raise OpenAIError(400, "stream_options must be an object", param="stream_options")


def _inject_prompt(prompt: Any, text: str) -> Any:
    """Text prompts get the library first; token-id prompts (lists of ints) pass through untouched."""
    if not text:
        return prompt
    if isinstance(prompt, str):
        return f"{text}\n\n{prompt}"
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return [f"{text}\n\n{p}" for p in prompt]
    return prompt


async def _unless_disconnected(request: Request, work):
    """Run the upstream call, cancelling it if the client goes away first."""
    task = asyncio.ensure_future(work)
    while not task.done():
        done, _ = await asyncio.wait({task}, timeout=0.25)
        if not done and await request.is_disconnected():
            task.cancel()
            raise OpenAIError(499, "client disconnected")
    return task.result()
