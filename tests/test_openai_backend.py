"""The OpenAI-compatible backend against an in-process server (httpx's MockTransport): how it learns which way of
asking for schema-constrained JSON a server accepts, when many learner calls are in flight at once."""

import asyncio
import json

import httpx

from gym_tf.backends.openai_http import OpenAIBackend

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


def json_object_only_server(in_flight: int):
    """Refuses `json_schema` the way llama-cpp-python's server does, accepts `json_object`; holds the first
    `in_flight` requests until all have arrived, so their refusals are truly concurrent."""
    bodies: list[dict] = []
    arrived = asyncio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if len(bodies) >= in_flight:
            arrived.set()
        await arrived.wait()
        if body.get("response_format", {}).get("type") == "json_schema":
            refusal = {"error": {"message": "response_format type json_schema is not supported"}}
            return httpx.Response(400, json=refusal)
        return httpx.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": '{"ok": true}'}, "finish_reason": "stop"}]})

    return handle, bodies


async def test_concurrent_refusals_fall_back_once_and_keep_the_constraint():
    handle, bodies = json_object_only_server(in_flight=3)
    backend = OpenAIBackend("http://fake/v1", model="m", max_retries=0, transport=httpx.MockTransport(handle))
    messages = [{"role": "user", "content": "reply in JSON"}]
    replies = await asyncio.gather(*(backend.generate(messages, json_schema=SCHEMA) for _ in range(3)))
    assert [r.choices[0].text for r in replies] == ['{"ok": true}'] * 3
    assert backend.schema_modes == ["json_object"]
    # three refused json_schema requests, then three retries that all still carry the schema as json_object
    assert [b["response_format"]["type"] for b in bodies] == ["json_schema"] * 3 + ["json_object"] * 3
    assert all(b["response_format"]["schema"] == SCHEMA for b in bodies[3:])
    await backend.aclose()
