"""`gym-tf serve` with the official openai client: a recording fake upstream (its own process, so it can be killed)
for what the upstream receives, and real upstreams (llama-cpp-python's server, the embedded model) end to end."""

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

from conftest import free_port, wait_for
from gym_tf.library import (EMPTY_LIBRARY, AddOp, ExampleOp, RenderPolicy, apply_ops, example_text,
                            render_library, short, with_policy)
from gym_tf.store import RunStore
from server import ServerConfig, create_app
from server.upstream import Upstream

TESTS = Path(__file__).parent
KEY = {"Authorization": "Bearer k2"}  # one of the `fake` fixture's keys
HI = [{"role": "user", "content": "hi"}]


class Running:
    """Our app under uvicorn in a thread, on a loopback port."""

    def __init__(self, app):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_fake(tmp_path, supports_n=True, delay=0.0, port=None):
    port, record = port or free_port(), tmp_path / f"record-{time.time_ns()}.jsonl"
    record.touch()
    process = subprocess.Popen([sys.executable, str(TESTS / "fake_upstream.py"), str(port), str(record),
                                "1" if supports_n else "0", str(delay)])
    wait_for(f"http://127.0.0.1:{port}/v1/models", process, timeout=30)
    return process, f"http://127.0.0.1:{port}/v1", record


def received(record):
    return [json.loads(line) for line in record.read_text().splitlines()]


@pytest.fixture
def library_store(tmp_path):
    store = RunStore(tmp_path / "ws")
    v1, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="Check units before answering.")], step=1)
    v2, _ = apply_ops(v1, [AddOp(op="add", text="Verify arithmetic twice.")], step=2)
    for v in (v1, v2):
        store.put_version(v, run_id="r", status="promoted")
    store.promote(v1.id)
    return store, v1, v2


@pytest.fixture
def fake(tmp_path, library_store):
    store, v1, v2 = library_store
    process, url, record = start_fake(tmp_path)
    running = Running(create_app(Upstream(url), store, ServerConfig(api_keys=["k1", "k2"])))
    client = openai.OpenAI(base_url=running.url, api_key="k2", max_retries=0)
    yield client, record, store, v1, v2, process, running
    running.stop()
    process.kill()
    process.wait()


def test_library_injected_once_first_in_the_system_message(fake):
    client, record, store, v1, *_ = fake
    text = render_library(v1)
    client.chat.completions.create(model="anything", messages=[{"role": "user", "content": "hi"}])
    client.chat.completions.create(model="anything", messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    first, second = received(record)
    systems = [[m for m in body["messages"] if m["role"] == "system"] for body in (first, second)]
    assert [len(s) for s in systems] == [1, 1]
    assert systems[0][0]["content"] == text
    assert systems[1][0]["content"] == text + "\n\nBe brief."
    assert first["messages"][0]["content"] == second["messages"][0]["content"][: len(text)]  # identical prefix
    assert first["model"] == "fake-model"


def test_every_other_field_passes_through_untouched(fake):
    client, record, *_ = fake
    extra = dict(temperature=0.3, top_p=0.9, seed=7, stop=["\n\n"], max_tokens=12, logprobs=True, top_logprobs=2,
                 user="u1", response_format={"type": "json_object"}, parallel_tool_calls=False,
                 tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                 tool_choice="auto")
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], **extra,
                                   extra_body={"top_k": 5, "repetition_penalty": 1.1, "chat_template_kwargs": {"x": 1}})
    [body] = received(record)
    for key, value in {**extra, "top_k": 5, "repetition_penalty": 1.1, "chat_template_kwargs": {"x": 1}}.items():
        assert body[key] == value, key


def test_response_header_names_the_version_and_pinning_works(fake):
    client, record, store, v1, v2, *_ = fake
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-gym-tf-library-version"] == v1.id
    raw = client.chat.completions.with_raw_response.create(model=f"m@{short(v2.id)}", messages=[{"role": "user", "content": "x"}])
    assert raw.headers["x-gym-tf-library-version"] == v2.id
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "x"}], extra_headers={"x-gym-tf-library": "empty"})
    assert raw.headers["x-gym-tf-library-version"] == EMPTY_LIBRARY.id
    assert received(record)[-1]["messages"] == [{"role": "user", "content": "x"}]


def test_a_version_that_shows_examples_as_turns_is_sent_upstream_as_turns(fake):
    """Serve sends a chat request what optimize and eval send (`library_messages`): examples as turns before the
    user's message when the version's policy says so; a text prompt (/v1/completions) gets them as text."""
    client, record, store, v1, *_ = fake
    turns, _ = apply_ops(v1, [ExampleOp(op="example", text=example_text("2 + 2?", "\\boxed{4}"))], step=3)
    turns = with_policy(turns, RenderPolicy(examples_as_turns=True))
    store.put_version(turns, run_id="r", status="promoted")
    asked = [{"role": "user", "content": "3 + 3?"}]
    client.chat.completions.create(model=f"m@{short(turns.id)}", messages=asked)
    assert received(record)[-1]["messages"] == turns.messages(asked) == [
        {"role": "system", "content": render_library(v1)}, {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "\\boxed{4}"}, *asked]
    client.completions.create(model=f"m@{short(turns.id)}", prompt="3 + 3?")
    assert "2 + 2?" in received(record)[-1]["prompt"]


def test_unknown_pinned_version_is_404_in_openai_shape(fake):
    client, *_ = fake
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="m@deadbeef", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["type"] == "not_found_error" and "deadbeef" in caught.value.body["message"]


def test_api_keys(fake):
    client, _, _, _, _, _, running = fake
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=running.url, api_key="wrong", max_retries=0).models.list()
    assert httpx.post(f"{running.url}/chat/completions", json={}).status_code == 401
    assert httpx.get(f"http://127.0.0.1:{running.port}/health").status_code == 200  # health stays public
    assert [m.id for m in client.models.list()][0] == "fake-model"


def test_streaming_with_usage_and_n_2(fake):
    client, *_ = fake
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True, n=2,
                                            stream_options={"include_usage": True})
    texts, usage = {0: "", 1: ""}, None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
        usage = chunk.usage or usage
    assert texts == {0: "Hello from the fake upstream.", 1: "Hello from the fake upstream."}
    assert usage.completion_tokens == 12


def test_fan_out_when_the_upstream_ignores_n(tmp_path, library_store):
    store, *_ = library_store
    process, url, record = start_fake(tmp_path, supports_n=False)
    running = Running(create_app(Upstream(url), store))
    try:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=3, seed=1)
        assert [c.index for c in reply.choices] == [0, 1, 2] and reply.usage.completion_tokens == 18
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=2,
                                                stream=True, seed=5, stream_options={"include_usage": True})
        chunks = list(stream)
        assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
        assert len({c.id for c in chunks}) == 1 and chunks[-1].usage.completion_tokens == 12
        seeds = sorted(b["seed"] for b in received(record)[-2:])
        assert seeds == [5, 6]
    finally:
        running.stop()
        process.kill()


def test_completions_inject_text_prompts_only(fake):
    client, record, store, v1, *_ = fake
    text = render_library(v1)
    client.completions.create(model="m", prompt="2+2=")
    client.completions.create(model="m", prompt=["a", "b"])
    client.completions.create(model="m", prompt=[1, 2, 3])
    bodies = received(record)
    assert bodies[0]["prompt"] == f"{text}\n\n2+2="
    assert bodies[1]["prompt"] == [f"{text}\n\na", f"{text}\n\nb"]
    assert bodies[2]["prompt"] == [1, 2, 3]


def test_promote_switches_without_restart_and_in_flight_keeps_its_version(tmp_path, library_store):
    store, v1, v2 = library_store
    process, url, record = start_fake(tmp_path, delay=0.2)
    running = Running(create_app(Upstream(url), store))
    try:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0)
        with client.chat.completions.with_streaming_response.create(
                model="m", messages=[{"role": "user", "content": "slow"}], stream=True) as slow:
            RunStore(store.root).promote(v2.id)  # what `gym-tf library promote` does, from another connection
            body = b"".join(slow.iter_bytes())
            assert slow.headers["x-gym-tf-library-version"] == v1.id and b"[DONE]" in body
        after = client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert after.headers["x-gym-tf-library-version"] == v2.id
        first, second = received(record)
        assert first["messages"][0]["content"] == render_library(v1)
        assert second["messages"][0]["content"] == render_library(v2)
    finally:
        running.stop()
        process.kill()


def test_upstream_killed_mid_stream_ends_with_an_error_event(tmp_path, library_store):
    store, *_ = library_store
    process, url, _ = start_fake(tmp_path, delay=0.5)
    running = Running(create_app(Upstream(url), store))
    try:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0, timeout=20)
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
        start = time.time()
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            for i, _ in enumerate(stream):
                if i == 1:
                    process.kill()
        assert time.time() - start < 10
        # and a dead upstream answers 502 at once, readiness 503
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert caught.value.status_code == 502 and "unreachable" in caught.value.message
        assert httpx.get(f"http://127.0.0.1:{running.port}/health/ready").status_code == 503
    finally:
        running.stop()


def test_body_limit_and_bad_json(library_store, tmp_path):
    store, *_ = library_store
    running = Running(create_app(Upstream("http://127.0.0.1:9/v1", model="m"), store, ServerConfig(max_body_bytes=1000)))
    try:
        big = httpx.post(f"{running.url}/chat/completions", json={"messages": [{"role": "user", "content": "x" * 2000}]})
        assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"
        bad = httpx.post(f"{running.url}/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    finally:
        running.stop()


def test_metrics_count_requests_tokens_and_the_served_version(fake):
    client, _, _, v1, _, _, running = fake
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    text = httpx.get(f"http://127.0.0.1:{running.port}/metrics", headers=KEY).text
    assert 'gym_tf_requests_total{route="/chat/completions",status="200"} 1.0' in text
    assert 'gym_tf_tokens_total{kind="completion"} 6.0' in text
    assert f'gym_tf_library_served{{version="{v1.id}"}} 1.0' in text
    assert httpx.get(f"http://127.0.0.1:{running.port}/health/ready", headers=KEY).json()["status"] == "ready"


# --- hardening (issue #12, items 6 and 7) ------------------------------------------------------------------------


def test_keys_guard_everything_but_the_liveness_probe(fake):
    *_, running = fake
    root = f"http://127.0.0.1:{running.port}"
    for path in ("/metrics", "/openapi.json", "/health/ready", "/v1/models", "/nowhere"):
        refused = httpx.get(root + path)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", path
        assert "127.0.0.1" not in refused.text  # readiness names the upstream only to a key holder
    assert httpx.get(root + "/health").status_code == 200
    for path in ("/metrics", "/openapi.json", "/health/ready"):
        assert httpx.get(root + path, headers=KEY).status_code == 200, path


def test_unknown_paths_answer_in_openai_shape(fake):
    *_, running = fake
    reply = httpx.get(f"http://127.0.0.1:{running.port}/v1/nowhere", headers=KEY)
    assert reply.status_code == 404 and reply.json()["error"]["type"] == "not_found_error"


def test_n_is_capped_and_a_fan_out_holds_few_connections(tmp_path, library_store):
    store, v1, _ = library_store
    process, url, _ = start_fake(tmp_path, supports_n=False, delay=0.05)
    running = Running(create_app(Upstream(url, fan_out=4), store, ServerConfig(max_n=16)))
    try:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0, timeout=30)
        reply = client.chat.completions.create(model="m", messages=HI, n=12)
        assert [c.index for c in reply.choices] == list(range(12))
        chunks = list(client.chat.completions.create(model="m", messages=HI, n=12, stream=True))
        assert {c.choices[0].index for c in chunks if c.choices} == set(range(12))
        assert 1 < httpx.get(url.removesuffix("/v1") + "/stats").json()["max_in_flight"] <= 4
        for n in (17, 0, -1):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model="m", messages=HI, n=n)
            assert caught.value.body["param"] == "n"
            assert caught.value.response.headers["x-gym-tf-library-version"] == v1.id  # errors name the version too
    finally:
        running.stop()
        process.kill()


def test_a_fan_out_stream_with_a_bad_upstream_line_ends_with_an_error_event(tmp_path, library_store):
    store, *_ = library_store
    process, url, _ = start_fake(tmp_path, supports_n=False)
    running = Running(create_app(Upstream(url), store))
    try:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0, timeout=10)
        for include_usage in (False, True):
            stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "bad-line"}],
                                                    n=2, stream=True, stream_options={"include_usage": include_usage})
            with pytest.raises(openai.APIError, match="bad event"):
                list(stream)
    finally:
        running.stop()
        process.kill()


def test_a_chunked_body_over_the_limit_is_refused_before_it_ends(library_store):
    store, *_ = library_store
    running = Running(create_app(Upstream("http://127.0.0.1:9/v1", model="m"), store, ServerConfig(max_body_bytes=1000)))
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=5) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (2000, b" " * 2000))
            # the body has not ended (no closing 0-chunk): a server that buffers it whole would still be waiting
            reply = b""
            while b"}}" not in reply and (part := conn.recv(4096)):
                reply += part
        assert reply.startswith(b"HTTP/1.1 413") and b'"type":"invalid_request_error"' in reply
    finally:
        running.stop()


def test_an_upstream_down_at_start_up_is_asked_again_for_its_model(tmp_path, library_store):
    store, *_ = library_store
    port = free_port()
    running = Running(create_app(Upstream(f"http://127.0.0.1:{port}/v1"), store))
    process = None
    try:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="m", messages=HI)
        assert caught.value.status_code == 502
        process, _, record = start_fake(tmp_path, port=port)
        client.chat.completions.create(model="m", messages=HI)
        assert received(record)[-1]["model"] == "fake-model"
        assert [m.id for m in client.models.list()][0] == "fake-model"
    finally:
        running.stop()
        if process:
            process.kill()


def test_a_pin_is_an_exact_id_or_a_plain_prefix_and_rejected_versions_need_the_full_id(fake):
    client, record, store, v1, v2, *_ = fake
    v3, _ = apply_ops(v2, [AddOp(op="add", text="A lesson the gate turned down.")], step=3)
    store.put_version(v3, run_id="r", status="rejected")

    def answering(pin):
        return client.chat.completions.with_raw_response.create(
            model="m", messages=HI, extra_headers={"x-gym-tf-library": pin}).headers["x-gym-tf-library-version"]

    assert answering(short(v2.id)) == v2.id and answering(v3.id) == v3.id
    for pin in ("%", "%" + v2.id[-10:], "_" + v2.id[1:], v2.id[:-1] + "_", "b%", short(v3.id), v3.id[:-1],
                v2.id.upper(), "bafkrei"):
        with pytest.raises(openai.NotFoundError):
            answering(pin)
    assert [m.id for m in client.models.list()] == ["fake-model", f"fake-model@{short(v1.id)}", f"fake-model@{short(v2.id)}"]


def test_errors_after_the_version_is_chosen_carry_its_header(tmp_path, library_store):
    store, v1, _ = library_store
    running = Running(create_app(Upstream("http://127.0.0.1:9/v1", model="m"), store))
    try:
        reply = httpx.post(f"{running.url}/chat/completions", json={"messages": HI})
        assert reply.status_code == 502 and reply.headers["x-gym-tf-library-version"] == v1.id
        assert reply.json()["error"]["type"] == "upstream_error"
    finally:
        running.stop()


@pytest.mark.parametrize("mode", ["no-usage", "usage-in-last"])
@pytest.mark.parametrize("n", [1, 2])
def test_include_usage_always_ends_with_one_usage_chunk(tmp_path, library_store, mode, n):
    store, *_ = library_store
    process, url, _ = start_fake(tmp_path, supports_n=False)
    running = Running(create_app(Upstream(url, supports_n=False), store))
    try:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0, timeout=20)
        chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": mode}], n=n,
                                                     stream=True, stream_options={"include_usage": True}))
        assert [c.usage is not None for c in chunks].count(True) == 1 and chunks[-1].choices == []
        assert chunks[-1].usage.completion_tokens == 6 * n  # upstream's own count, or one token per content chunk
        assert chunks[-1].usage.prompt_tokens == (10 * n if mode == "usage-in-last" else 0)
        texts = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                 for i in range(n)}
        assert set(texts.values()) == {"Hello from the fake upstream."}
        metrics = httpx.get(f"http://127.0.0.1:{running.port}/metrics").text
        assert f'gym_tf_tokens_total{{kind="completion"}} {6.0 * n}' in metrics
    finally:
        running.stop()
        process.kill()


# --- real upstreams ------------------------------------------------------------------------------------------------


def assert_usage_chunks(client: openai.OpenAI, model: str) -> None:
    """`stream_options.include_usage` on a real upstream: one usage chunk, last, with `choices: []` and exact counts
    (4 tokens generated when the stream stops for length; the prompt as counted by a non-streamed request)."""
    messages = [{"role": "user", "content": "Count from one to twenty in words."}]
    prompt_tokens = client.chat.completions.create(model=model, messages=messages, max_tokens=1).usage.prompt_tokens
    for n in (1, 2):
        chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4, n=n, stream=True,
                                                     stream_options={"include_usage": True}))
        assert [c.usage is not None for c in chunks].count(True) == 1 and chunks[-1].choices == []
        assert chunks[-1].usage.prompt_tokens == n * prompt_tokens
        assert chunks[-1].usage.completion_tokens == n * 4 == chunks[-1].usage.total_tokens - n * prompt_tokens
    chunks = list(client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=4, stream=True,
                                            stream_options={"include_usage": True}))
    assert [c.usage is not None for c in chunks].count(True) == 1 and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 4


@pytest.mark.embedded
def test_against_llama_cpp_server(llama_server, library_store):
    store, v1, _ = library_store
    running = Running(create_app(Upstream(llama_server), store))
    try:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0)
        chat = client.chat.completions.with_raw_response.create(
            model="qwen-0.5b", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8)
        assert chat.headers["x-gym-tf-library-version"] == v1.id and chat.parse().choices[0].message.content
        two = client.chat.completions.create(model="qwen-0.5b", messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=4)
        assert [c.index for c in two.choices] == [0, 1]
        stream = client.chat.completions.create(model="qwen-0.5b", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=6, stream=True, n=2)
        assert {c.choices[0].index for c in stream if c.choices} == {0, 1}
        done = client.completions.create(model="qwen-0.5b", prompt="1, 2, 3,", max_tokens=4)
        assert done.choices[0].text
        assert_usage_chunks(client, "qwen-0.5b")
        assert [m.id for m in client.models.list()][:1] == ["qwen-0.5b"]
    finally:
        running.stop()


@pytest.mark.embedded
def test_gym_tf_serve_on_the_embedded_model(tmp_path, library_store):
    store, v1, _ = library_store
    port = free_port()
    workspace = store.root
    process = subprocess.Popen([sys.executable, "-m", "gym_tf", "serve", "--port", str(port), "--workspace", str(workspace),
                                "--api-key", "secret"])
    try:
        wait_for(f"http://127.0.0.1:{port}/health", process, timeout=120)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="secret", max_retries=0)
        reply = client.chat.completions.with_raw_response.create(
            model="default", messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=16, n=2)
        assert reply.headers["x-gym-tf-library-version"] == v1.id and len(reply.parse().choices) == 2
        chunks = list(client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=6, stream=True))
        assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
        assert_usage_chunks(client, "default")
    finally:
        process.terminate()
        process.wait(timeout=30)
