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


def first_choice_usage_server(lengths: list[int]):
    """Answers n > 1 as llama.cpp's llama-server does with several slots: `usage.completion_tokens` counts the first
    choice alone; with `logprobs`, each choice carries one entry per token. Choice i is `lengths[i]` tokens long and
    cut at `max_tokens` when it reaches it."""
    bodies: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        cap = body["max_tokens"]
        used = [min(length, cap) for length in lengths[:body.get("n", 1)]]
        choices = [{"index": i, "message": {"role": "assistant", "content": "word " * k},
                    "finish_reason": "length" if k == cap else "stop",
                    "logprobs": {"content": [{"token": "w", "logprob": -0.1, "bytes": None, "top_logprobs": []}] * k}
                    if body.get("logprobs") else None}
                   for i, k in enumerate(used)]
        return httpx.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"], "choices": choices,
            "usage": {"prompt_tokens": 3, "completion_tokens": used[0], "total_tokens": 3 + used[0]}})

    return handle, bodies


async def test_a_server_that_counts_the_first_choice_alone_is_counted_per_choice():
    handle, bodies = first_choice_usage_server([6, 8, 8, 3])
    backend = OpenAIBackend("http://fake/v1", model="m", max_retries=0, transport=httpx.MockTransport(handle))
    messages = [{"role": "user", "content": "Count."}]
    # the first group gives it away: two choices were cut at 8 tokens, yet usage says 6 in all
    first = await backend.generate(messages, n=4, max_tokens=8)
    assert backend.counts_each_choice is False and "logprobs" not in bodies[0]
    assert [c.completion_tokens for c in first.choices] == [2, 8, 8, 1]  # usage shared out, raised to what is known
    assert first.completion_tokens == 19  # a lower bound of the true 25, where usage alone said 6
    # every later group is counted exactly, off each choice's log-probabilities
    later = await backend.generate(messages, n=4, max_tokens=8)
    assert bodies[1]["logprobs"] is True and bodies[1]["top_logprobs"] == 1
    assert [c.completion_tokens for c in later.choices] == [6, 8, 8, 3] and later.completion_tokens == 25
    # a single answer is asked as before
    one = await backend.generate(messages, max_tokens=8)
    assert "logprobs" not in bodies[2] and one.completion_tokens == 6
    await backend.aclose()


def cut_group_reply(n: int, content: str, completion_tokens: int) -> httpx.Response:
    """n choices of `content`, each cut at the cap, and a usage of `completion_tokens` for the whole reply."""
    choices = [{"index": i, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}
               for i in range(n)]
    usage = {"prompt_tokens": 3, "completion_tokens": completion_tokens, "total_tokens": 3 + completion_tokens}
    return httpx.Response(200, json={"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                     "choices": choices, "usage": usage})


async def test_a_server_whose_usage_counts_every_choice_is_not_asked_for_log_probabilities():
    bodies = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        return cut_group_reply(body["n"], "ok", 8 * body["n"])

    backend = OpenAIBackend("http://fake/v1", model="m", max_retries=0, transport=httpx.MockTransport(handle))
    for _ in range(2):
        group = await backend.generate([{"role": "user", "content": "Hi"}], n=3, max_tokens=8)
        assert [c.completion_tokens for c in group.choices] == [8, 8, 8]
    assert backend.counts_each_choice is None and not any("logprobs" in b for b in bodies)
    await backend.aclose()


async def test_a_group_that_stops_by_itself_still_shows_a_usage_that_counted_one_choice():
    """No choice cut at the cap, so no bound is broken: the characters left to each counted token give it away
    (llama.cpp's usage counts the first of four similar answers)."""
    handle, bodies = first_choice_usage_server([10, 10, 10, 10])
    backend = OpenAIBackend("http://fake/v1", model="m", max_retries=0, transport=httpx.MockTransport(handle))
    first = await backend.generate([{"role": "user", "content": "Count."}], n=4, max_tokens=64)
    assert backend.counts_each_choice is False  # 200 characters of text against 10 tokens counted
    assert first.completion_tokens == 10  # no bound is known above what usage said: counted as it was
    later = await backend.generate([{"role": "user", "content": "Count."}], n=4, max_tokens=64)
    assert bodies[1]["logprobs"] is True and later.completion_tokens == 40
    await backend.aclose()


async def test_a_server_that_refuses_log_probabilities_is_asked_again_without_them():
    calls = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append(body)
        if body.get("logprobs"):
            return httpx.Response(400, json={"error": {"message": "logprobs is not supported"}})
        return cut_group_reply(body["n"], "word " * 8, 8)

    backend = OpenAIBackend("http://fake/v1", model="m", max_retries=0, transport=httpx.MockTransport(handle))
    messages = [{"role": "user", "content": "Hi"}]
    await backend.generate(messages, n=2, max_tokens=8)  # finds the usage counts one choice
    group = await backend.generate(messages, n=2, max_tokens=8)  # asks with log-probabilities, refused, asks again
    assert [bool(b.get("logprobs")) for b in calls] == [False, True, False]
    assert backend.logprobs_refused and group.completion_tokens == 16  # the bounds, as on the first group
    await backend.generate(messages, n=2, max_tokens=8)
    assert "logprobs" not in calls[-1] and len(calls) == 4  # never asked again
    await backend.aclose()
