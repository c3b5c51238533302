"""`POST /v1/feedback`: what a user thought of a response, by the response id the client already has.

    {"response_id": "chatcmpl-...", "score": "up" | "down" | 0.0..1.0, "correction": "...", "comment": "...",
     "choice": 0}

At least one of score, correction, comment; `choice` (default 0) names the choice of an n > 1 response. Idempotent per (response id, API key): posting again replaces what that
key said before. A response id this tenant was never answered with is a 404, in the OpenAI error shape, whether it
belongs to another tenant or to nobody: one tenant learns nothing of another's traffic.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from pydantic import ValidationError

from gym_tf.errors import UnknownChoice
from gym_tf.traffic import DEFAULT_TENANT, Feedback
from server import schema
from server.errors import OpenAIError
from server.recording import Recorder, RecorderDown

MAX_FEEDBACK_BYTES = 128 * 1024


BodyReader = Callable[[Request, int], Awaitable[dict[str, Any]]]


def register(app: FastAPI, recorder: Recorder | None, read_body: BodyReader) -> None:
    """Add the route; `read_body` is the app's own bounded, depth-checked JSON reader."""
    @app.post("/v1/feedback", openapi_extra=schema.operation(Feedback.model_json_schema(), pinned=False))
    async def feedback(request: Request):
        body = await read_body(request, MAX_FEEDBACK_BYTES)
        try:
            given = Feedback.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or None
            raise OpenAIError(400, f"invalid feedback{' field ' + where if where else ''}: {first['msg']}",
                              param=where) from None
        if recorder is None:
            raise OpenAIError(404, "this server does not record responses (start it with --record)",
                              code="recording_off")
        state = request.scope.get("state") or {}
        tenant, key = state.get("tenant", DEFAULT_TENANT), state.get("key_id", "anonymous")
        try:
            replaced = await recorder.feedback(tenant, given, key)
        except (LookupError, asyncio.TimeoutError):
            raise OpenAIError(404, f"no recorded response {given.response_id!r}", code="response_not_found",
                              param="response_id") from None
        except UnknownChoice as exc:
            raise OpenAIError(400, f"invalid feedback field choice: {exc}", param="choice") from None
        except RecorderDown as exc:
            raise OpenAIError(503, f"feedback cannot be recorded now: {exc}", code="recorder_down") from None
        return {"object": "feedback", "response_id": given.response_id, "score": given.value,
                "correction": given.correction is not None, "comment": given.comment is not None, "choice": given.choice,
                "replaced": replaced, "created": int(time.time())}
