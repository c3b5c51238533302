"""What the proxy's routes accept and answer, as OpenAPI fragments for `/openapi.json`.

The routes read raw bodies (every field is forwarded untouched, so no pydantic model may drop or coerce one), which
leaves FastAPI nothing to describe. These fragments say what a client may send: the fields the proxy itself reads,
with their OpenAI types, and the common sampling fields; anything else is allowed and passed through. An API fuzzer
(tests/test_attack_api.py) generates requests from them, valid ones and invalid ones.
"""

from __future__ import annotations

from typing import Any

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    }},
}

_SAMPLING = {
    "model": {"type": "string", "description": "ignored except for `NAME@VERSION`, which pins a library version"},
    "n": {"type": "integer", "minimum": 1, "maximum": 128},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "seed": {"type": "integer"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
}

_CONTENT_PART = {"type": "object", "required": ["type"],
                 "properties": {"type": {"type": "string"}, "text": {"type": "string"}}}

CHAT_REQUEST = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        **_SAMPLING,
        "messages": {"type": "array", "items": {
            "type": "object", "required": ["role"],
            "properties": {"role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
                           "content": {"anyOf": [{"type": "string"}, {"type": "null"},
                                                 {"type": "array", "items": _CONTENT_PART}]}},
        }},
    },
}

COMPLETION_REQUEST = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        **_SAMPLING,
        "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}},
                             {"type": "array", "items": {"type": "integer", "minimum": 0}}]},
    },
}

_LIBRARY_HEADER = {"name": "x-gym-tf-library", "in": "header", "required": False,
                   "schema": {"type": "string"}, "description": "pin a library version (full id or unique prefix)"}


def operation(request_schema: dict[str, Any], pinned: bool = True) -> dict[str, Any]:
    """The `openapi_extra` of a route that reads its body raw: the body, the pin header where a library answers, and
    the OpenAI error shape for 4xx/5xx."""
    error = {"content": {"application/json": {"schema": ERROR}}}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": request_schema}}},
        "parameters": [_LIBRARY_HEADER] if pinned else [],
        "responses": {"200": {"description": "the upstream's answer (JSON, or an event stream with `stream`)"},
                      "400": {"description": "invalid request", **error},
                      "404": {"description": "unknown library version", **error},
                      "413": {"description": "request body too large", **error},
                      "502": {"description": "the upstream failed", **error}},
    }
