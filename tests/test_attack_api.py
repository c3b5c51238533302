"""`gym-tf serve` attacked from its own OpenAPI schema (issue #17): Schemathesis generates requests from
`/openapi.json`, valid ones and ones that break the schema (negative mode), and sends them over real HTTP to the
proxy, which fronts a fake upstream process. Every answer must be a 2xx or a 4xx in the OpenAI error shape
(`{"error": {"message", "type", "param", "code"}}`), never a 5xx; no request may hang (each has a deadline); a
stream must end with `[DONE]` or an error event. Hand-written hostile requests are in test_server_hostile.py.

Quick tier: a few hundred requests. `pytest -m soak`: GYM_TF_SOAK_API_EXAMPLES per operation and mode (default 1,000).
"""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance

from gym_tf.library import EMPTY_LIBRARY, AddOp, apply_ops
from gym_tf.store import RunStore
from server import ServerConfig, create_app
from server.upstream import Upstream
from test_server import Running, start_fake

DEADLINE_S = 10.0  # a request without an answer by then counts as a hang


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    """The proxy serving a library, before a fake upstream that ignores `n` (so fan-out runs too)."""
    tmp = tmp_path_factory.mktemp("attack-api")
    store = RunStore(tmp / "ws")
    v1, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="Check units before answering.")], step=1)
    store.put_version(v1, run_id="r", status="promoted")
    store.promote(v1.id)
    process, url, _ = start_fake(tmp, supports_n=False)
    app = create_app(Upstream(url, supports_n=False), store, ServerConfig(max_body_bytes=1 << 20, max_n=8))
    running = Running(app)
    yield app, running.url.removesuffix("/v1")
    running.stop()
    process.kill()


def fuzz(app, base_url: str, examples: int) -> Counter:
    """Every operation of the schema, in positive and negative mode, `examples` cases each. Returns the outcomes."""
    schema = schemathesis.openapi.from_dict(app.openapi())
    # Schemathesis reads at most 20 events of a stream by default and drops the rest, [DONE] included: read them all
    schema.config.max_stream_events = 100_000
    outcomes: Counter = Counter()
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        # a GET without parameters has no invalid form: only the proxied POST routes are attacked in both modes
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if operation.method.upper() == "POST" else [])
        for mode in modes:
            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def attack(case):
                started = time.monotonic()
                try:
                    reply = case.call(base_url=base_url, session=session, timeout=DEADLINE_S)
                except requests.Timeout:
                    outcomes["hang"] += 1
                    raise AssertionError(f"no answer within {DEADLINE_S} s: {case.as_curl_command()}") from None
                outcomes["requests"] += 1
                outcomes[f"{reply.status_code // 100}xx"] += 1
                assert reply.status_code < 500, (reply.status_code, reply.text[:300], case.as_curl_command())
                case.validate_response(reply, checks=[not_a_server_error, response_schema_conformance])
                if reply.status_code >= 400:
                    error = reply.json()["error"]
                    assert set(error) == {"message", "type", "param", "code"}, reply.text[:300]
                    assert isinstance(error["message"], str) and error["message"], reply.text[:300]
                elif (reply.headers.get("content-type") or [""])[0].startswith("text/event-stream"):
                    if reply.stream_cut_short:  # still open at the deadline
                        outcomes["hang"] += 1
                        raise AssertionError(f"a stream still open after {DEADLINE_S} s: {case.as_curl_command()}")
                    last = reply.content.rstrip().rsplit(b"\n\n", 1)[-1]
                    assert last == b"data: [DONE]" or b'"error"' in last, reply.content[-300:]
                outcomes["slowest_ms"] = max(outcomes["slowest_ms"], int(1000 * (time.monotonic() - started)))

            attack()
    return outcomes


def report(figures, outcomes: Counter, elapsed: float) -> None:
    figures("schemathesis", f"{outcomes['requests']:,} requests, {outcomes['5xx']} 5xx, {outcomes['hang']} hangs, "
            f"{outcomes['4xx']:,} 4xx all OpenAI-shaped, {outcomes['2xx']:,} 2xx, slowest "
            f"{outcomes['slowest_ms']} ms, {elapsed:.0f} s")


def test_schema_driven_requests_never_get_a_5xx_or_hang(proxy, figures):
    app, base_url = proxy
    started = time.monotonic()
    outcomes = fuzz(app, base_url, examples=100)
    report(figures, outcomes, time.monotonic() - started)
    assert outcomes["requests"] >= 300 and outcomes["5xx"] == 0 and outcomes["hang"] == 0


@pytest.mark.soak
def test_schema_driven_requests_soak(proxy, figures):
    app, base_url = proxy
    started = time.monotonic()
    outcomes = fuzz(app, base_url, examples=int(os.environ.get("GYM_TF_SOAK_API_EXAMPLES", "1000")))
    report(figures, outcomes, time.monotonic() - started)
    assert outcomes["5xx"] == 0 and outcomes["hang"] == 0


def test_the_schema_describes_what_the_proxy_reads(proxy):
    """The fuzzer is only as good as the schema: the proxied routes must describe their bodies and error shape."""
    paths = proxy[0].openapi()["paths"]
    for path, required in [("/v1/chat/completions", "messages"), ("/v1/completions", "prompt")]:
        post = paths[path]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["required"] == [required]
        assert post["responses"]["400"]["content"]["application/json"]["schema"]["required"] == ["error"]
