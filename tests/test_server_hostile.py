"""Hostile requests against `gym-tf serve`: small malformed bodies (issue #12, item 18) and a bounded, seeded random
walk over request shapes (issue #17). Whatever arrives, the answer is a 2xx or a 4xx in the OpenAI error shape, never
a 5xx, and a stream always ends.

`GYM_TF_FUZZ_REQUESTS` raises the random walk's count (default 1,000: a few seconds on 2 cores)."""

import json
import os
import random

import httpx
import pytest

from gym_tf.library import EMPTY_LIBRARY, AddOp, apply_ops
from gym_tf.store import RunStore
from server import ServerConfig, create_app
from server.upstream import Upstream
from test_server import Running, start_fake

HI = [{"role": "user", "content": "hi"}]
REQUESTS = int(os.environ.get("GYM_TF_FUZZ_REQUESTS", "1000"))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The proxy with a library served, in front of a fake upstream that ignores `n` (so fan-out runs too)."""
    tmp = tmp_path_factory.mktemp("hostile")
    store = RunStore(tmp / "ws")
    v1, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="Check units before answering.")], step=1)
    store.put_version(v1, run_id="r", status="promoted")
    store.promote(v1.id)
    process, url, _ = start_fake(tmp, supports_n=False)
    running = Running(create_app(Upstream(url, supports_n=False), store, ServerConfig(max_body_bytes=1 << 20)))
    with httpx.Client(base_url=running.url, timeout=20) as client:
        yield client
    running.stop()
    process.kill()


def assert_openai_error(reply: httpx.Response) -> None:
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.text[:300])
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)


@pytest.mark.parametrize("body", [
    {"messages": ["hi"]},                              # a ValueError in the library merge, before
    {"model": 5, "messages": HI},                      # a TypeError reading the pin
    {"model": ["m"], "messages": HI},
    {"messages": HI, "n": -1},                         # an IndexError on the embedded upstream, before
    {"messages": HI, "n": 0},
    {"messages": HI, "n": "2"},
    {"messages": HI, "n": True},
    {"messages": HI, "n": 1.5},
    {"messages": HI, "n": 10 ** 30},
    {"messages": HI, "n": 2, "seed": "7"},             # a TypeError in the fan-out's seed arithmetic
    {"messages": HI, "stream": True, "stream_options": "yes"},
    {"messages": [{"content": "no role"}]},
    {"messages": [{"role": 5, "content": "x"}]},
    {"messages": {"role": "user", "content": "hi"}},
    {"messages": HI, "model": "m@%"},
    {"messages": HI, "model": "m@_"},
])
def test_small_hostile_chat_bodies_get_a_400(served, body):
    reply = served.post("/chat/completions", json=body)
    assert reply.status_code in (400, 404)
    assert_openai_error(reply)


@pytest.mark.parametrize("raw", [
    b"[" * 100_000,                                   # a RecursionError, uncaught, before
    b'{"messages": ' + b"[" * 100_000,
    b'{"a":' * 100_000,
    b"null", b"[]", b"5", b'"x"', b"\xff\xfe\x00", b"", b"{", b'{"messages": NaN',
])
def test_bodies_that_are_not_a_json_object_get_a_400(served, raw):
    for path in ("/chat/completions", "/completions"):
        reply = served.post(path, content=raw, headers={"content-type": "application/json"})
        assert reply.status_code == 400
        assert_openai_error(reply)


def test_deep_but_valid_json_is_forwarded_or_refused_never_a_500(served):
    for depth in (100, 500, 900, 990, 1100):
        raw = '{"messages": %s, "extra": %s}' % (json.dumps(HI), "[" * depth + "]" * depth)
        reply = served.post("/chat/completions", content=raw, headers={"content-type": "application/json"})
        if reply.status_code != 200:
            assert_openai_error(reply)


# --- a seeded random walk over request shapes -------------------------------------------------------------------

JUNK = [None, True, False, 0, -1, 1, 2, 3, 129, 1.5, -0.0, "", "x", "m@", "m@%", "m@empty", "\u0000", "é" * 3, [], {},
        [1, 2], ["a"], {"role": "user"}, [{"role": "user", "content": "hi"}], {"include_usage": True}, "bad-line",
        "no-usage", "usage-in-last"]


def junk(rng: random.Random, depth: int = 0):
    pick = rng.random()
    if depth < 3 and pick < 0.15:
        return [junk(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 3 and pick < 0.25:
        return {rng.choice(["role", "content", "type", "text", "include_usage", "x"]): junk(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    return rng.choice(JUNK)


def hostile_body(rng: random.Random, chat: bool) -> dict:
    """Mostly plausible requests with one or two fields gone wrong, and now and then nothing plausible at all."""
    body: dict = {"model": "m", "max_tokens": 4}
    if chat:
        body["messages"] = [{"role": rng.choice(["user", "system", "developer", "assistant"]),
                             "content": rng.choice(["hi", "bad-line", "no-usage", "usage-in-last", None, [
                                 {"type": "text", "text": "hi"}]])}
                            for _ in range(rng.randint(1, 3))]
    else:
        body["prompt"] = rng.choice(["2+2=", ["a", "b"], [1, 2, 3], None])
    body["stream"] = rng.random() < 0.5
    if rng.random() < 0.5:
        body["n"] = rng.choice([1, 2, 3])
    if rng.random() < 0.3:
        body["stream_options"] = {"include_usage": rng.random() < 0.8}
    if rng.random() < 0.3:
        body["seed"] = rng.randint(0, 2 ** 31)
    for _ in range(rng.choice([0, 1, 1, 2])):
        key = rng.choice(["model", "messages", "prompt", "n", "stream", "stream_options", "seed", "temperature",
                          "stop", "extra"])
        body[key] = junk(rng)
    return body


def test_random_hostile_requests_never_get_a_5xx_or_hang(served):
    rng = random.Random(12)
    outcomes: dict[str, int] = {}
    for i in range(REQUESTS):
        chat = rng.random() < 0.7
        body = hostile_body(rng, chat)
        path = "/chat/completions" if chat else "/completions"
        with served.stream("POST", path, json=body, headers={"x-gym-tf-library": rng.choice(["", "empty", "%"])}
                           if rng.random() < 0.2 else None) as reply:
            text = reply.read()  # a hang ends in the client's timeout, failing the test
            if reply.status_code >= 400:
                assert_openai_error(reply)
            elif reply.headers["content-type"].startswith("text/event-stream"):
                last = text.rstrip().rsplit(b"\n\n", 1)[-1]
                assert last == b"data: [DONE]" or b'"error"' in last, (body, text[-300:])
            outcomes[str(reply.status_code)] = outcomes.get(str(reply.status_code), 0) + 1
    print(f"{REQUESTS} hostile requests: {outcomes}")
    assert not any(status.startswith("5") for status in outcomes)
