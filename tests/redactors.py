"""Redaction hooks for the recording tests: `module:function` callables over one exchange."""

import re


def mask_digits(exchange):
    """Every digit in the request and the answers becomes #."""
    mask = lambda value: re.sub(r"\d", "#", value) if isinstance(value, str) else value  # noqa: E731
    request = dict(exchange["request"])
    request["messages"] = [{**m, "content": mask(m.get("content"))} for m in request.get("messages", [])]
    return {**exchange, "request": request, "answers": [mask(a) for a in exchange["answers"]]}


def drop_secrets(exchange):
    """Keep nothing of a request that mentions a secret."""
    return None if "secret" in str(exchange["request"]) else exchange


def broken(exchange):
    raise RuntimeError("a redactor bug")


def reshape(exchange):
    """A hook that breaks the row's shape: nothing is kept, and the recorder goes on."""
    return {"surprise": 1}
