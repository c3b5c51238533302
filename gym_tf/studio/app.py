"""The studio's routes: one small view per page, each an HTML page and its JSON twin at the same URL + `.json`.

Reads run in worker threads, each on its own read-only SQLite connection, so a page never waits on (or blocks) the
proxy's event loop. Actions (promote, roll back) run on the event loop through the workspace's `RunStore`, the
same call `gym-tf library promote` makes; a running `gym-tf serve` reads the served pointer per request.

Auth: the same keys as the API, as a bearer header or, for a browser, a cookie set by the login form. With no keys
configured the pages are open; actions always need an admin key.
"""

from __future__ import annotations

import hmac
import math
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, quote

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from gym_tf.errors import StoreError, UnknownRecord, UnknownRun, UnknownVersion
from gym_tf.library import short
from gym_tf.store import RunStore
from gym_tf.studio import queries
from gym_tf.studio.charts import run_chart
from ledger.log import MerkleLog

COOKIE = "gym_tf_studio"
STATIC = Path(__file__).parent / "static"
NOT_FOUND = (UnknownRun, UnknownVersion, UnknownRecord)


@dataclass
class StudioConfig:
    keys: list[str] = field(default_factory=list)  # read access; none: the pages are open
    admin_keys: list[str] = field(default_factory=list)  # actions; none: the studio is read-only


class Reader:
    """One read-only connection (and one Merkle log handle) per worker thread."""

    def __init__(self, root: Path):
        self.root = root
        self.path = root / "gym-tf.db"
        self._local = threading.local()

    def connection(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        return con

    def log(self) -> MerkleLog:
        log = getattr(self._local, "log", None)
        if log is None:
            log = self._local.log = MerkleLog(self.path)
        return log


def _matches(token: str, keys: list[str]) -> bool:
    # compare against every key, so the time taken does not reveal which one (if any) matched
    return any([hmac.compare_digest(token.encode(), key.encode()) for key in keys])


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity (a trainer may log them): they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _number(text: str | None, default: int | None = None) -> int:
    """A page or row number from a URL; anything else names no record."""
    if text is None and default is not None:
        return default
    if text is None or not text.isdigit() or len(text) > 15:
        raise UnknownRecord(f"not a number: {str(text)[:20]!r}")
    return int(text)


def _when(timestamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp)) if timestamp else ""


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("gym_tf.studio", "templates"), autoescape=select_autoescape(["html"]))
    env.filters.update(short=lambda v: short(v or ""), when=_when, fmt=_fmt,
                       signed=lambda v: "–" if v is None else f"{v:+.3f}", q=lambda v: quote(str(v), safe=""))
    return env


def create_studio(store: RunStore, config: StudioConfig | None = None) -> Starlette:
    """The studio as an ASGI app, to mount at `/ui` (`gym-tf serve` does; `gym-tf ui` serves it alone)."""
    config = config or StudioConfig()
    reader = Reader(store.root)
    env = _environment()

    def access(request: Request) -> str | None:
        """`admin`, `read`, or None (refused)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token if scheme.lower() == "bearer" and token else request.cookies.get(COOKIE, "")
        if token and _matches(token, config.admin_keys):
            return "admin"
        if not config.keys or (token and _matches(token, config.keys)):
            return "read"
        return None

    def html(request: Request, template: str, data: dict[str, Any], status: int = 200, **extra: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "")
        context = {"data": data, "base": base, "path": request.url.path, "query": request.url.query,
                   "admin": access(request) == "admin", "actions": bool(config.admin_keys),
                   "keys": bool(config.keys), **extra}
        return HTMLResponse(env.get_template(template).render(context), status_code=status)

    def refused(request: Request, as_json: bool) -> Response:
        message = "a valid API key is required (Authorization: Bearer KEY, or log in)"
        if as_json:
            return JSONResponse({"error": message}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return html(request, "login.html", {"message": message, "next": request.url.path}, status=401)

    def not_found(request: Request, as_json: bool, message: str) -> Response:
        if as_json:
            return JSONResponse({"error": message}, status_code=404)
        return html(request, "error.html", {"message": message, "status": 404}, status=404)

    def page(view: Callable[..., dict[str, Any]], template: str, as_json: bool) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:  # sync: Starlette runs it in a worker thread
            if access(request) is None:
                return refused(request, as_json)
            try:
                data = view(reader.connection(), request)
            except NOT_FOUND as exc:
                return not_found(request, as_json, str(exc))
            if as_json:
                return JSONResponse(_finite(data))
            chart = Markup(run_chart(data["steps"], data["val_baseline"])) if template == "run.html" else ""
            return html(request, template, data, chart=chart, served=queries.served_version_id(reader.connection()),
                        json_url=f"{request.url.path}.json"
                        + (f"?{request.url.query}" if request.url.query else ""))
        return endpoint

    def pages(path: str, template: str, view: Callable[..., dict[str, Any]]) -> list[Route]:
        # the twin first: `{id}` would otherwise swallow the `.json`
        return [Route(f"{path}.json", page(view, template, True)), Route(path, page(view, template, False))]

    def query_page(request: Request) -> int:
        return _number(request.query_params.get("page"), default=1)

    p = lambda request, name: request.path_params[name]  # noqa: E731 - a path parameter, as text

    routes = [
        Route("/", lambda request: RedirectResponse(f"{request.scope.get('root_path', '')}/runs", status_code=307)),
        *pages("/runs", "runs.html", lambda con, r: queries.runs(con, reader.root)),
        *pages("/runs/{run_id}", "run.html",
               lambda con, r: queries.run(con, reader.root, p(r, "run_id"), query_page(r))),
        *pages("/runs/{run_id}/steps/{step}", "step.html",
               lambda con, r: queries.step(con, p(r, "run_id"), _number(p(r, "step")))),
        *pages("/calls/{call_id}", "call.html", lambda con, r: queries.learner_call(con, _number(p(r, "call_id")))),
        *pages("/rollouts/{rollout_id}", "rollout.html",
               lambda con, r: queries.rollout(con, _number(p(r, "rollout_id")))),
        *pages("/versions", "versions.html", lambda con, r: queries.versions(con, query_page(r))),
        *pages("/versions/{ref}", "version.html", lambda con, r: queries.version(con, p(r, "ref"))),
        *pages("/versions/{ref}/items/{item}", "item.html",
               lambda con, r: queries.item(con, p(r, "ref"), p(r, "item"))),
        *pages("/diff", "diff.html",
               lambda con, r: queries.diff(con, r.query_params.get("a", ""), r.query_params.get("b", ""))),
        *pages("/evaluations", "evaluations.html", lambda con, r: queries.evaluations(con)),
        *pages("/evaluations/{evaluation_id}", "evaluation.html",
               lambda con, r: queries.evaluation(con, p(r, "evaluation_id"))),
        *pages("/ledger", "ledger.html", lambda con, r: queries.ledger(con, reader.log(), query_page(r))),
    ]

    # --- actions: promote a version, roll back to the served version's parent -------------------------------------

    async def act(request: Request, as_json: bool, choose: Callable[[], str]) -> Response:
        level = access(request)
        if level is None:
            return refused(request, as_json)
        origin = request.headers.get("origin")
        if level != "admin" or (origin and origin != f"{request.url.scheme}://{request.url.netloc}"):
            message = ("actions need an admin key" if config.admin_keys else
                       "this studio is read-only: start it with --admin-key to promote or roll back")
            if level == "admin":
                message = "refused: the request came from another site"
            if as_json:
                return JSONResponse({"error": message}, status_code=403)
            return html(request, "error.html", {"message": message, "status": 403}, status=403)
        try:
            version_id = choose()
            store.promote(version_id)  # what `gym-tf library promote` does; servers read it per request
        except NOT_FOUND as exc:
            return not_found(request, as_json, str(exc))
        except StoreError as exc:
            return JSONResponse({"error": str(exc)}, status_code=409) if as_json else \
                html(request, "error.html", {"message": str(exc), "status": 409}, status=409)
        if as_json:
            return JSONResponse({"served": version_id})
        base = request.scope.get("root_path", "")
        return RedirectResponse(f"{base}/versions/{version_id}", status_code=303)

    def promote_route(as_json: bool) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            return await act(request, as_json, lambda: queries.resolve_version(store.db.conn, request.path_params["ref"]))
        return endpoint

    def rollback_route(as_json: bool) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            def parent_of_served() -> str:
                served = store.served_version_id()
                row = store.db.conn.execute("select parent from versions where id = ?", [served]).fetchone()
                if not row or not row[0]:
                    raise StoreError("nothing to roll back to: the served version has no parent")
                return queries.resolve_version(store.db.conn, row[0])
            return await act(request, as_json, parent_of_served)
        return endpoint

    routes += [
        Route("/versions/{ref}/promote.json", promote_route(True), methods=["POST"]),
        Route("/versions/{ref}/promote", promote_route(False), methods=["POST"]),
        Route("/rollback.json", rollback_route(True), methods=["POST"]),
        Route("/rollback", rollback_route(False), methods=["POST"]),
    ]

    # --- log in and out (a browser cannot send a bearer header) ----------------------------------------------------

    async def login(request: Request) -> Response:
        base = request.scope.get("root_path", "")
        if request.method == "GET":
            return html(request, "login.html", {"message": "", "next": request.query_params.get("next", "")})
        body = b""
        async for chunk in request.stream():  # a login form is tiny: read no more than 4 KB of anything sent
            body += chunk
            if len(body) > 4096:
                break
        form = parse_qs(body[:4096].decode("utf-8", "replace"))
        key, target = form.get("key", [""])[0], form.get("next", [""])[0]
        if not target.startswith(f"{base}/") or target.startswith("//"):  # never redirect off the studio
            target = f"{base}/runs"
        if not key or not (_matches(key, config.keys) or _matches(key, config.admin_keys)):
            return html(request, "login.html", {"message": "that key is not accepted", "next": target}, status=401)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, key, httponly=True, samesite="strict", path=base or "/")
        return response

    async def logout(request: Request) -> Response:
        base = request.scope.get("root_path", "")
        response = RedirectResponse(f"{base}/login", status_code=303)
        response.delete_cookie(COOKIE, path=base or "/")
        return response

    routes += [Route("/login", login, methods=["GET", "POST"]), Route("/logout", logout, methods=["POST"]),
               Mount("/static", StaticFiles(directory=STATIC), name="static")]

    async def http_error(request: Request, exc: HTTPException) -> Response:
        as_json = request.url.path.endswith(".json")
        if exc.status_code == 404:
            return not_found(request, as_json, "no such page")
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


async def favicon(request: Request) -> Response:
    """Browsers ask for `/favicon.ico` on every page, a JSON twin too; an error there is a console error."""
    return Response((STATIC / "favicon.svg").read_bytes(), media_type="image/svg+xml",
                    headers={"Cache-Control": "max-age=86400"})


def studio_app(store: RunStore, config: StudioConfig | None = None) -> Starlette:
    """The studio alone (`gym-tf ui`): mounted at `/ui`, with `/` sending a browser there."""
    return Starlette(routes=[Route("/", lambda request: RedirectResponse("/ui/runs", status_code=307)),
                             Route("/favicon.ico", favicon), Mount("/ui", create_studio(store, config))])
