"""Recording and feedback (issue #14) end to end: the official openai client against the real app, a fake upstream
in its own process, and the recorded rows read back from the real SQLite file."""

import json
import time

import httpx
import openai
import pytest

from gym_tf.errors import ConfigError
from gym_tf.library import EMPTY_LIBRARY, AddOp, apply_ops
from gym_tf.rollouts import build_messages
from gym_tf.store import RunStore
from gym_tf.traffic import Feedback, TrafficLog, problem_row, traffic_dataset
from server import ServerConfig, create_app
from server.recording import KILL_FILE, Recorder, RecordSettings, relay_onto
from server.upstream import Upstream
from test_server import Running, received, start_fake

HI = [{"role": "user", "content": "What is 6 times 7?"}]
TENANTS = {"k-acme": "acme", "k-globex": "globex"}


def rows(workspace, expected, tenant=None, timeout=10.0):
    """The recorded exchanges once `expected` are there (the writer thread works off the request path)."""
    log = TrafficLog(workspace)
    deadline = time.time() + timeout
    while True:
        found = [r for t in ([tenant] if tenant else ["default", "acme", "globex"]) for r in log.exchanges(t)]
        if len(found) >= expected or time.time() > deadline:
            log.close()
            return found
        time.sleep(0.05)


@pytest.fixture
def served(tmp_path):
    store = RunStore(tmp_path / "ws")
    v1, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="Check units before answering.")], step=1)
    store.put_version(v1, run_id="r", status="promoted")
    store.promote(v1.id)
    process, url, record = start_fake(tmp_path)
    recorder = Recorder(store.root, RecordSettings())
    config = ServerConfig(api_keys=["k-default", *TENANTS], tenants=TENANTS)
    running = Running(create_app(Upstream(url), store, config, recorder))
    clients = {name: openai.OpenAI(base_url=running.url, api_key=key, max_retries=0)
               for name, key in [("default", "k-default"), ("acme", "k-acme"), ("globex", "k-globex")]}
    yield clients, store, v1, running, recorder
    running.stop()
    process.kill()
    process.wait()


def feedback(client, **body):
    return client.post("/feedback", body=body, cast_to=httpx.Response).json()


def test_every_kind_of_response_is_recorded_with_the_id_the_client_saw(served):
    clients, store, v1, *_ = served
    client = clients["default"]
    plain = client.chat.completions.create(model="m", messages=HI)
    two = client.chat.completions.create(model="m", messages=HI, n=2)
    chunks = list(client.chat.completions.create(model="m", messages=HI, stream=True,
                                                 stream_options={"include_usage": True}))
    bare = list(client.chat.completions.create(model="m", messages=HI, stream=True))
    done = client.completions.create(model="m", prompt="2+2=")
    recorded = {r["response_id"]: r for r in rows(store.root, 5, "default")}
    assert set(recorded) == {plain.id, two.id, chunks[0].id, bare[0].id, done.id}
    first = recorded[plain.id]
    assert first["request"]["messages"] == HI  # as the client sent it: the library is not in it
    assert first["library_version"] == v1.id and first["model"] == "fake-model"
    assert first["answers"] == ["Hello from the fake upstream."] and first["finish_reasons"] == ["stop"]
    assert first["usage"]["completion_tokens"] == 6 and first["latency_s"] > 0
    assert recorded[two.id]["answers"] == ["Hello from the fake upstream."] * 2
    streamed = recorded[chunks[0].id]
    assert streamed["answers"] == ["Hello from the fake upstream."] and streamed["usage"]["completion_tokens"] == 6
    assert recorded[bare[0].id]["answers"] == ["Hello from the fake upstream."] and recorded[bare[0].id]["usage"] is None
    assert recorded[done.id]["request"]["prompt"] == "2+2=" and recorded[done.id]["answers"] == [" done"]


def test_feedback_right_after_a_stream_is_idempotent_per_key_and_404_for_unknown_ids(served):
    clients, store, *_ = served
    client = clients["default"]
    chunks = list(client.chat.completions.create(model="m", messages=HI, stream=True))
    answer = feedback(client, response_id=chunks[0].id, score="up")  # the moment the stream ended
    assert answer["replaced"] is False and answer["score"] == 1.0
    again = feedback(client, response_id=chunks[0].id, score="down", correction="42")
    assert again["replaced"] is True
    other_key = openai.OpenAI(base_url=str(client.base_url), api_key="k-default", max_retries=0)
    assert feedback(other_key, response_id=chunks[0].id, comment="fine")["replaced"] is True  # same key: same row
    [row] = rows(store.root, 1, "default")
    assert [(f["score"], f["correction"], f["comment"]) for f in row["feedback"]] == [(None, None, "fine")]
    with pytest.raises(openai.NotFoundError) as caught:
        feedback(client, response_id="chatcmpl-nobody", score="up")
    assert caught.value.body["code"] == "response_not_found" and caught.value.body["param"] == "response_id"


def test_feedback_names_the_choice_of_an_n_2_response(served):
    clients, store, *_ = served
    client = clients["default"]
    two = client.chat.completions.create(model="m", messages=HI, n=2)
    assert feedback(client, response_id=two.id, score="up", choice=1)["choice"] == 1
    with pytest.raises(openai.BadRequestError) as caught:
        feedback(client, response_id=two.id, score="up", choice=2)
    assert caught.value.body["param"] == "choice" and "has 2 choice(s)" in caught.value.body["message"]
    [row] = rows(store.root, 1, "default")
    assert [(f["choice"], f["score"]) for f in row["feedback"]] == [(1, 1.0)]  # the refused one changed nothing


def test_the_served_answer_is_the_choice_the_feedback_names():
    exchange = {"response_id": "r", "route": "/chat/completions", "library_version": "v",
                "request": {"messages": [{"role": "user", "content": "6 x 7?"}]},
                "answers": ["so \\boxed{41}", "so \\boxed{42}"]}
    said = lambda choice, score, at: {"choice": choice, "score": score, "correction": None, "comment": None,  # noqa: E731
                                      "created": at}
    up = problem_row({**exchange, "feedback": [said(0, 0.0, 1.0), said(1, 1.0, 2.0)]})
    # the newest feedback is about choice 1; the thumbs down on choice 0 is not counted against it
    assert (up["served_answer"], up["answer"], up["label"], up["score"]) == ("so \\boxed{42}", "42", "up", 1.0)
    down = problem_row({**exchange, "feedback": [said(1, 1.0, 1.0), said(0, 0.0, 2.0)]})
    assert (down["served_answer"], down["answer"], down["label"]) == ("so \\boxed{41}", None, "down")
    # a comment posted later, about no choice in particular (0 by default), does not move the scored choice
    commented = problem_row({**exchange, "feedback": [said(1, 1.0, 1.0), {**said(0, None, 2.0), "comment": "ok"}]})
    assert (commented["served_answer"], commented["label"]) == ("so \\boxed{42}", "up")
    unrated = problem_row({**exchange, "feedback": []})
    assert unrated["served_answer"] == "so \\boxed{41}" and unrated["label"] == "none"


def test_a_recorded_conversation_is_re_sampled_exactly_as_it_was_served(tmp_path):
    """A follow-up turn under the app's own system prompt: the problem keeps the turns it follows, and optimize asks
    the model the very messages the upstream received when it was served (the app's system prompt, the library
    injected the same way, no gym-tf instructions added)."""
    store = RunStore(tmp_path / "ws")
    library, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="Multiply the count by the number per box.")], step=1)
    store.put_version(library, run_id="r", status="promoted")
    store.promote(library.id)
    process, url, record = start_fake(tmp_path)
    running = Running(create_app(Upstream(url), store, ServerConfig(api_keys=["k"]), Recorder(store.root, RecordSettings())))
    try:
        client = openai.OpenAI(base_url=running.url, api_key="k", max_retries=0)
        conversation = [{"role": "system", "content": "You are the egg shop's assistant. Answer in one line."},
                        {"role": "user", "content": "A box holds 6 eggs. How many eggs are in 7 boxes?"},
                        {"role": "assistant", "content": "42 eggs."},
                        {"role": "user", "content": "And in twice as many boxes?"}]
        reply = client.chat.completions.create(model="m", messages=conversation)
        feedback(client, response_id=reply.id, score="down", correction="84")
        rows(store.root, 1, "default")
    finally:
        running.stop()
        process.kill()
        process.wait()
    [upstream_saw] = [body["messages"] for body in received(record)]
    log = TrafficLog(store.root)
    train, _, _ = traffic_dataset(log, "default", tmp_path / "snapshot")
    log.close()
    [problem] = load_dataset(train)
    assert problem.conversation == conversation and problem.answer == "84"
    assert problem.problem == ("User: A box holds 6 eggs. How many eggs are in 7 boxes?\n\nAssistant: 42 eggs.\n\n"
                               "User: And in twice as many boxes?")
    messages, shown = build_messages(problem, library)
    assert messages == upstream_saw and shown == tuple(i.id for i in library.items)
    assert upstream_saw[0]["content"].endswith("\n\n" + conversation[0]["content"]) and len(upstream_saw) == 4


@pytest.mark.parametrize("messages, kept", [
    # an agent's request after a tool answered: re-sent whole
    ([{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": None, "tool_calls": []},
      {"role": "tool", "content": "-3 C", "tool_call_id": "t"}], True),
    # a request that ends with the assistant's turn (a prefill): not one to re-send; its user text is the problem
    ([{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": "It is"}], False),
])
def test_every_recorded_chat_is_a_problem_and_those_fit_to_re_send_keep_their_messages(messages, kept):
    exchange = {"response_id": "r", "route": "/chat/completions", "library_version": "v", "feedback": [],
                "request": {"messages": messages}, "answers": ["cold"]}
    row = problem_row(exchange)
    assert ("messages" in row) is kept
    assert row["problem"] == ("User: Weather in Oslo?\n\nTool: -3 C" if kept else "Weather in Oslo?")


def test_a_log_recorded_before_feedback_named_a_choice_opens_and_merges(tmp_path):
    import sqlite3

    for name in ("old", "new"):
        TrafficLog(tmp_path / name).close()
    old = sqlite3.connect(tmp_path / "old" / "traffic.db")
    old.execute("alter table feedback drop column choice")  # the table as it was before
    old.execute("insert into traffic (response_id, tenant, created, route, model, library_version, request, answers) "
                "values ('r1', 'default', 1.0, '/chat/completions', 'm', 'v', '{}', ?)", [json.dumps(["a", "b"])])
    old.execute("insert into feedback values ('default', 'r1', 'k', 1.0, null, null, 2.0)")
    old.commit()
    old.close()
    merged = TrafficLog(tmp_path / "new").merge(tmp_path / "old")
    assert merged == {"exchanges": 1, "feedback": 1}
    [row] = TrafficLog(tmp_path / "new").exchanges("default")
    assert [(f["choice"], f["score"]) for f in row["feedback"]] == [(0, 1.0)]
    reopened = TrafficLog(tmp_path / "old")  # opening the old log adds the column, every row about choice 0
    assert [f["choice"] for f in next(reopened.exchanges("default"))["feedback"]] == [0]


def test_a_tenant_never_sees_another_tenants_responses(served):
    clients, store, *_ = served
    acme = clients["acme"].chat.completions.create(model="m", messages=HI)
    for other in ("globex", "default"):
        with pytest.raises(openai.NotFoundError):
            feedback(clients[other], response_id=acme.id, score="up")
    assert feedback(clients["acme"], response_id=acme.id, score=0.75)["score"] == 0.75
    assert [r["response_id"] for r in rows(store.root, 1, "acme")] == [acme.id]
    assert rows(store.root, 0, "globex", timeout=0.2) == [] and rows(store.root, 0, "default", timeout=0.2) == []


@pytest.mark.parametrize("body", [
    {}, {"response_id": "x"}, {"response_id": "x", "score": 2}, {"response_id": "x", "score": "meh"},
    {"response_id": "x", "score": float("nan")}, {"response_id": 5, "score": "up"}, {"response_id": "", "score": "up"},
    {"response_id": "x", "score": "up", "extra": 1}, {"response_id": "x" * 300, "score": "up"},
    {"response_id": "x", "correction": ""}, {"response_id": "x", "comment": ["a"]}, {"response_id": None},
    {"response_id": "x", "score": "up", "choice": -1}, {"response_id": "x", "score": "up", "choice": 1.5},
    {"response_id": "x", "score": "up", "choice": 10**6}, {"response_id": "x", "score": "up", "choice": True},
    {"response_id": "x", "score": "up", "choice": "1"},
])
def test_hostile_feedback_bodies_get_a_400_in_openai_shape(served, body):
    clients, _, _, running, _ = served
    reply = httpx.post(f"{running.url}/feedback", content=json.dumps(body), headers={"Authorization": "Bearer k-default"})
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error", reply.text


def test_hostile_feedback_transport(served):
    *_, running, _ = served
    auth = {"Authorization": "Bearer k-default"}
    assert httpx.post(f"{running.url}/feedback", json={"response_id": "x", "score": "up"}).status_code == 401
    for raw in (b"[1]", b"{nope", b'"up"', b"[" * 5000, b""):
        reply = httpx.post(f"{running.url}/feedback", content=raw, headers=auth)
        assert reply.status_code == 400 and "error" in reply.json(), raw[:10]
    big = httpx.post(f"{running.url}/feedback", json={"response_id": "x", "comment": "y" * 200_000}, headers=auth)
    assert big.status_code == 413
    assert httpx.get(f"{running.url}/feedback", headers=auth).status_code == 405


def test_kill_switch_stops_and_resumes_recording(served):
    clients, store, *_ = served
    client = clients["default"]
    (store.root / KILL_FILE).touch()
    time.sleep(1.1)  # the server looks at the file at most once a second
    unrecorded = client.chat.completions.create(model="m", messages=HI)
    (store.root / KILL_FILE).unlink()
    time.sleep(1.1)
    recorded = client.chat.completions.create(model="m", messages=HI)
    assert [r["response_id"] for r in rows(store.root, 1, "default")] == [recorded.id]
    with pytest.raises(openai.NotFoundError):
        feedback(client, response_id=unrecorded.id, score="up")


# ten digits: a four-digit secret turned up inside a stored timestamp ("created": 1795751234.05) and failed a clean run
SECRET = "8675309421"


def test_redaction_runs_before_storage_and_a_failing_hook_keeps_nothing(tmp_path):
    store = RunStore(tmp_path / "ws")
    process, url, _ = start_fake(tmp_path)
    try:
        for hook, expected in [("redactors:mask_digits", 1), ("redactors:drop_secrets", 1), ("redactors:broken", 0),
                               ("redactors:reshape", 0)]:
            workspace = tmp_path / hook.replace(":", "-")
            recorder = Recorder(workspace, RecordSettings(redact=hook))
            running = Running(create_app(Upstream(url), RunStore(workspace), None, recorder))
            client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0)
            client.chat.completions.create(model="m", messages=HI)
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"my secret is {SECRET}"}])
            kept = expected + (hook == "redactors:mask_digits")
            # wait long for rows that should come (a loaded machine starts the writer slowly), briefly for none
            found = rows(workspace, kept or 2, "default", timeout=20 if kept else 2)
            assert recorder.writer.poll() is None, hook  # a hook that fails never stops the recorder
            running.stop()
            assert len(found) == kept, hook
            stored = b"".join(p.read_bytes() for p in workspace.glob("*.db*"))  # the file and its WAL
            assert SECRET.encode() not in stored, hook  # nowhere in the file, not even in a freed page
            if hook == "redactors:mask_digits":
                assert found[0]["request"]["messages"][0]["content"] == "What is # times #?"
    finally:
        process.kill()


def test_retention_by_rows_and_by_age(tmp_path):
    log = TrafficLog(tmp_path)
    now = time.time()
    log.add([{"response_id": f"r{i}", "tenant": "default", "created": now - (10 - i) * 86400, "route": "/chat/completions",
              "request": json.dumps({"messages": HI}), "answers": "[]"} for i in range(10)])
    assert log.prune(max_days=None, max_rows=6) == 4
    assert [r["response_id"] for r in log.exchanges("default")] == [f"r{i}" for i in range(4, 10)]
    assert log.prune(max_days=2.5, max_rows=None, now=now) == 4
    assert [r["response_id"] for r in log.exchanges("default")] == ["r8", "r9"]



def _recorded(log, ids, with_correction):
    now = time.time()
    log.add([{"response_id": i, "tenant": "acme", "created": now, "route": "/chat/completions",
              "request": json.dumps({"messages": [{"role": "user", "content": f"question {i}"}]}), "answers": "[]"}
             for i in ids])
    for i in with_correction:
        log.put_feedback("acme", Feedback(response_id=i, correction="42"), key="k")


@pytest.mark.parametrize("labelled", [1, 2, 3, 4, 6])
def test_a_positive_val_fraction_always_holds_out_a_labelled_row_and_never_moves_one_into_it(tmp_path, labelled):
    log = TrafficLog(tmp_path)
    # ids whose hashes all fall above 0.2, so the hash rule alone would hold out nothing
    ids = [i for i in (f"resp-{n}" for n in range(200)) if _rank(i) > 0.2][:labelled + 2]
    _recorded(log, ids, ids[:labelled])
    train, val, counts = traffic_dataset(log, "acme", tmp_path / "snap", val_fraction=0.2)
    held = [json.loads(line)["id"] for line in open(val)]
    assert held == [min(ids[:labelled], key=_rank)] and counts["held_out"] == 1  # the lowest hash, never unlabelled
    assert counts["problems"] == labelled + 1
    assert traffic_dataset(log, "acme", tmp_path / "snap", val_fraction=0.0)[1] is None
    for bad in (-0.2, 1.0):
        with pytest.raises(ConfigError, match=f"--val-fraction {bad}: a fraction from 0"):
            traffic_dataset(log, "acme", tmp_path / "snap", val_fraction=bad)
    # more traffic, some of it under the fraction: the rows under it are held out, no row trained on before is
    more = [i for i in (f"later-{n}" for n in range(200)) if _rank(i) < 0.2][:2]
    _recorded(log, more, more)
    before_train = {json.loads(line)["id"] for line in open(train)}
    train, val, counts = traffic_dataset(log, "acme", tmp_path / "snap", val_fraction=0.2)
    assert {json.loads(line)["id"] for line in open(val)} == set(more)
    assert before_train <= {json.loads(line)["id"] for line in open(train)}
    log.close()


def _rank(response_id):
    import hashlib
    return int(hashlib.sha256(response_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

# --- learning from it (issue #14, items 3 to 5) ------------------------------------------------------------------

from fakes import ScriptedBackend, default_learner  # noqa: E402
from gym_tf.config import OptimizeConfig  # noqa: E402
from gym_tf.datasets import load_dataset  # noqa: E402
from gym_tf.learn import from_traffic, promote_if_passed, promotions  # noqa: E402
from gym_tf.optimize import Optimizer  # noqa: E402
from gym_tf.publishing import verify_ledger  # noqa: E402
from ledger.errors import TamperedError  # noqa: E402

BASE = OptimizeConfig(dataset="unused", batch_size=4, group_size=4, epochs=1, seed=2, val_samples=4)
# The gate's tests: the held-out slice is chosen by a hash of response ids the upstream made at random, so it may be
# as small as 1 problem; 8 samples each make a harmful library (never right) lose on every one of them.
GATED = BASE.model_copy(update={"val_samples": 8})


class LibraryMatters(ScriptedBackend):
    """The frozen model: right far more often with a library in its prompt (`helps`), or far less (harmful)."""

    def __init__(self, answers, helps: bool):
        super().__init__(answers)
        self.helps = helps

    def skill_for(self, messages):
        with_library = "Experiences learned" in str(messages[0]["content"]) or "Worked examples" in str(messages[0]["content"])
        return (0.9 if with_library else 0.3) if self.helps else (0.0 if with_library else 0.6)


def send_quickstart_traffic(client, problems):
    """Each problem as a chat request; feedback on most: corrections, thumbs down, thumbs up; none on two."""
    ids = {}
    for p in problems:
        ids[p.id] = client.chat.completions.create(model="m", messages=[{"role": "user", "content": p.problem}]).id
    for i, p in enumerate(problems):
        if i % 8 in (0, 1, 2, 3, 4):
            feedback(client, response_id=ids[p.id], score="down", correction=f"\\boxed{{{p.answer}}}")
        elif i % 8 == 5:
            feedback(client, response_id=ids[p.id], score="down", comment="wrong")
    return ids


async def test_traffic_and_feedback_teach_a_gated_library_served_without_restart(served):
    clients, store, v1, running, recorder = served
    problems = load_dataset("quickstart")[:16]
    answers = {p.problem: p.answer for p in problems}
    send_quickstart_traffic(clients["acme"], problems)
    rows(store.root, 16, "acme")  # (each feedback post returned once the writer had stored it)

    # the snapshot: acme's traffic only, corrections as references, a held-out slice of the labelled rows
    config = from_traffic(store, GATED, tenant="acme", val_fraction=0.4)
    train = [json.loads(line) for line in open(config.dataset)]
    val = [json.loads(line) for line in open(config.val_dataset)]
    assert len(train) + len(val) == 16 and val and all(r["label"] == "correction" for r in val)
    assert {r["label"] for r in train} <= {"correction", "down", "none"} and config.start_library == "empty"
    by_text = {r["problem"]: r for r in train + val}
    assert all(by_text[p.problem]["served_answer"] == "Hello from the fake upstream." for p in problems)

    # a harmful candidate: the gate rejects it, nothing is promoted, acme is still served the empty library
    harmful = await Optimizer(config, store, LibraryMatters(answers, helps=False)).run()
    labelled = {r["id"] for r in train if r["label"] != "none"}
    served = [r for r in store.rollouts(harmful.run_id) if r.library_version == "served"]
    assert {r.problem_id for r in served} == labelled  # the judged answer is one member of its group, scored 0
    assert all(r.completion == "Hello from the fake upstream." and r.reward == 0.0 and r.sample == 3 for r in served)
    assert all(len([r for r in store.rollouts(harmful.run_id) if r.problem_id == pid]) == 4 for pid in labelled)
    assert {v["status"] for v in store.versions(harmful.run_id)} == {"rejected"}
    assert promote_if_passed(store, harmful.run_id).version_id is None
    acme = clients["acme"].chat.completions.with_raw_response.create(model="m", messages=HI)
    assert acme.headers["x-gym-tf-library-version"] == EMPTY_LIBRARY.id

    # a good one: passes, is promoted, and the running server answers acme with it at once
    good = await Optimizer(config, store, LibraryMatters(answers, helps=True)).run()
    promotion = promote_if_passed(store, good.run_id)
    assert promotion.version_id == good.library.id and good.library.items
    acme = clients["acme"].chat.completions.with_raw_response.create(model="m", messages=HI)
    assert acme.headers["x-gym-tf-library-version"] == good.library.id
    [evidence] = promotions(store, "acme")
    assert evidence["evidence"]["evaluation"]["val_mean"] >= evidence["evidence"]["val_baseline"]
    verify_ledger(store)  # every version made from traffic, and the promotion, are in the ledger, and it verifies
    entry = json.loads(store.ledger.entry(evidence["leaf_index"]))
    assert entry["kind"] == "promotion" and entry["version"] == good.library.id and entry["tenant"] == "acme"
    store.db.execute("update promotions set evidence = ?", [json.dumps({"evaluation": {"val_mean": 1.0}})])
    with pytest.raises(TamperedError, match="evidence"):
        verify_ledger(store)

    # the other tenants see none of it: not served, not listed, not pinnable, their traffic untouched
    for other in ("globex", "default"):
        reply = clients[other].chat.completions.with_raw_response.create(model="m", messages=HI)
        assert reply.headers["x-gym-tf-library-version"] != good.library.id
        assert not any(good.library.id[:12] in m.id for m in clients[other].models.list())
        with pytest.raises(openai.NotFoundError):
            clients[other].chat.completions.create(model=f"m@{good.library.id}", messages=HI)
    assert any(good.library.id[:12] in m.id for m in clients["acme"].models.list())
    with pytest.raises(openai.NotFoundError):  # and acme cannot pin the default tenant's library either
        clients["acme"].chat.completions.create(model=f"m@{v1.id}", messages=HI)
    rows(store.root, 1, "globex")
    theirs = from_traffic(store, BASE, tenant="globex")  # globex learns from its own requests only
    assert {json.loads(line)["problem"] for line in open(theirs.dataset)} == {HI[0]["content"]}
    with pytest.raises(Exception, match="no recorded text requests"):
        from_traffic(store, BASE, tenant="nobody")


async def test_watch_learns_when_enough_feedback_arrived_and_never_promotes_a_failing_version(served):
    import asyncio

    from gym_tf.learn import watch

    clients, store, v1, running, recorder = served
    problems = load_dataset("quickstart")[:12]
    answers = {p.problem: p.answer for p in problems}
    acme = clients["acme"]
    ids = [acme.chat.completions.create(model="m", messages=[{"role": "user", "content": p.problem}]).id
           for p in problems]

    def give(indices):
        for i in indices:
            feedback(acme, response_id=ids[i], correction=f"\\boxed{{{problems[i].answer}}}")

    give(range(3))
    make = lambda: from_traffic(store, GATED, tenant="acme", val_fraction=0.5)  # noqa: E731
    backend = {"model": LibraryMatters(answers, helps=False)}

    async def run(config):
        return (await Optimizer(config, store, backend["model"]).run()).run_id

    lines = []
    task = asyncio.create_task(watch(store, make, run, "acme", min_feedback=9, interval_s=0.05, rounds=1,
                                     on_round=lines.append))
    await asyncio.sleep(0.5)
    assert not task.done() and store.runs() == [] and lines[-1] == "3 new feedback for 'acme', waiting for 9"
    await asyncio.to_thread(give, range(3, 9))
    [harmful] = await asyncio.wait_for(task, 60)
    assert harmful.version_id is None and store.served_version_id("acme") is None  # the gate said no
    backend["model"] = LibraryMatters(answers, helps=True)
    await asyncio.to_thread(give, range(9, 12))  # 3 new since the last run: what counts, even in a new process
    waiting = asyncio.create_task(watch(store, make, run, "acme", min_feedback=4, interval_s=0.05, rounds=1))
    await asyncio.sleep(0.3)
    assert not waiting.done() and len(store.runs()) == 1
    waiting.cancel()
    task = asyncio.create_task(watch(store, make, run, "acme", min_feedback=3, interval_s=0.05, rounds=1))
    [good] = await asyncio.wait_for(task, 60)
    assert good.version_id is not None and store.served_version_id("acme") == good.version_id
    assert acme.chat.completions.with_raw_response.create(
        model="m", messages=HI).headers["x-gym-tf-library-version"] == good.version_id


def test_a_stream_the_client_closes_at_done_is_recorded_and_one_cut_short_is_not(tmp_path):
    """The upstream holds its connection open after [DONE] (`linger`): the client leaves before the stream ends."""
    store = RunStore(tmp_path / "ws")
    process, url, _ = start_fake(tmp_path, delay=0.2)
    running = Running(create_app(Upstream(url), store, None, Recorder(store.root)))
    body = {"model": "m", "messages": [{"role": "user", "content": "linger"}], "stream": True}
    try:
        with httpx.Client(timeout=20) as client:
            with client.stream("POST", f"{running.url}/chat/completions", json=body) as reply:
                events = (json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {"))
                cut_short = next(events)["id"]  # gone after the first event
            with client.stream("POST", f"{running.url}/chat/completions", json=body) as reply:
                for line in reply.iter_lines():
                    if line == "data: [DONE]":
                        break  # gone at [DONE], as the openai SDK does
        recorded = rows(store.root, 1, "default", timeout=1.5)
        assert len(recorded) == 1 and recorded[0]["response_id"] != cut_short
        assert recorded[0]["answers"] == ["Hello from the fake upstream."]
    finally:
        running.stop()
        process.kill()


async def test_a_tape_opens_its_stream_to_feedback_at_the_id_and_keeps_only_complete_streams(tmp_path):
    """The server's relay loop puts each chunk on a Tape: the first chunk naming the id makes feedback on it wait
    for the stream; at close a stream is kept if it ended, or if [DONE] went out (here split over two chunks)."""
    recorder = Recorder(tmp_path / "ws", RecordSettings(flush_s=0.01))

    def event(ident: str, text: str) -> bytes:
        chunk = {"id": ident, "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
        return f"data: {json.dumps(chunk)}\n\n".encode()

    meta = {"tenant": "default", "created": time.time(), "route": "/chat/completions", "model": "m",
            "library_version": "none", "request": {"model": "m", "messages": HI, "stream": True}}
    try:
        for ident, tail, ended in [("chatcmpl-done", [b"data: [DO", b"NE]\n\n"], False),
                                   ("chatcmpl-cut", [], False), ("chatcmpl-ended", [], True)]:
            tape = recorder.tape(meta, time.perf_counter())
            tape.add(b": keep-alive\n\n")  # no id yet: not open to feedback
            assert recorder.open_streams == {}
            for chunk in [event(ident, "4"), event(ident, "2"), *tail]:
                tape.add(chunk)
                assert set(recorder.open_streams) == {("default", ident)}
            tape.close(ended)
            assert recorder.open_streams == {}

        async def upstream():  # through the server's own relay loop: ended, so kept; finished called once
            for chunk in [event("chatcmpl-relayed", "4"), event("chatcmpl-relayed", "2")]:
                yield chunk

        finished = []
        relayed = [c async for c in relay_onto(upstream(), recorder.tape(meta, 0.0), lambda: finished.append(1))]
        assert len(relayed) == 2 and finished == [1] and recorder.open_streams == {}
        await recorder.sync()
        kept = {row["response_id"]: row["answers"] for row in TrafficLog(tmp_path / "ws").exchanges("default")}
        assert kept == {"chatcmpl-done": ["42"], "chatcmpl-ended": ["42"], "chatcmpl-relayed": ["42"]}
        assert recorder.dropped == 0
    finally:
        recorder.close()


def test_a_dead_writer_costs_the_exchanges_not_the_answers(tmp_path):
    """The writer process is gone (killed): streams and plain answers are still served whole, each exchange that
    could not be kept is counted as dropped, and nothing is half-written."""
    store = RunStore(tmp_path / "ws")
    process, url, _ = start_fake(tmp_path)
    recorder = Recorder(store.root)
    running = Running(create_app(Upstream(url), store, None, recorder))
    try:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0)
        client.chat.completions.create(model="m", messages=HI)
        assert len(rows(store.root, 1)) == 1
        recorder.writer.kill()
        recorder.writer.wait()
        for _ in range(3):
            stream = client.chat.completions.create(model="m", messages=HI, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Hello from the fake upstream."
            assert client.chat.completions.create(model="m", messages=HI).choices[0].message.content
        deadline = time.time() + 5
        while recorder.dropped < 6 and time.time() < deadline:
            time.sleep(0.05)
        assert recorder.dropped == 6
        assert len(list(TrafficLog(store.root).exchanges("default"))) == 1
    finally:
        running.stop()
        recorder.close()
        process.kill()


async def test_a_judge_fallback_sees_the_users_comment_and_is_stored(served):
    clients, store, *_ = served
    problems = load_dataset("quickstart")[:4]
    acme = clients["acme"]
    for i, p in enumerate(problems):
        reply = acme.chat.completions.create(model="m", messages=[{"role": "user", "content": p.problem}])
        if i < 2:
            feedback(acme, response_id=reply.id, comment=f"please show the steps {i}")
    rows(store.root, 4, "acme")
    asked = []

    def learner(stage, prompt, attempt=0):
        if stage == "judge":
            asked.append(prompt)
            candidate = prompt.split("Candidate response:\n", 1)[1]
            return "INCORRECT" if "boxed{wrong}" in candidate or "fake upstream" in candidate else "CORRECT"
        return default_learner(stage, prompt, attempt)

    config = from_traffic(store, BASE, tenant="acme", fallback_reward="judge")
    backend = ScriptedBackend({p.problem: p.answer for p in problems}, learner=learner)
    result = await Optimizer(config, store, backend).run()
    commented = [a for a in asked if "please show the steps 0" in a]
    assert commented and all("A user was served this answer:\nHello from the fake upstream." in a for a in commented)
    assert any(a.endswith("Candidate response:\nHello from the fake upstream.\n\nDoes the candidate answer the "
                          "request correctly and helpfully, taking the user's comment into account? Reply with one "
                          "word: CORRECT or INCORRECT.") for a in commented)  # the served answer is judged too
    assert any("A user was served" not in a for a in asked)  # requests without feedback are judged plainly
    rollouts = store.rollouts(result.run_id)
    served = [r for r in rollouts if r.library_version == "served"]
    assert len(served) == 2 and all(r.reward == 0.0 for r in served)  # the comment made the judge say no
    assert {r.reward for r in rollouts if r.completion.endswith("{wrong}")} <= {0.0}
    assert {r.reward for r in rollouts if r.completion.startswith("Work") and not r.completion.endswith("{wrong}")} == {1.0}
    assert store.usage(result.run_id)["judge"]["prompt"] > 0  # counted, and stored for --resume


def test_a_random_walk_of_hostile_feedback_bodies_never_gets_a_5xx(served):
    import random

    clients, store, _, running, _ = served
    real = clients["default"].chat.completions.create(model="m", messages=HI).id
    values = [None, True, 0, -1, 1e308, float("inf"), "", "up", "down", "UP", real, "x" * 5000, [], {}, [real],
              {"$ne": None}, "\x00", "chatcmpl-' or 1=1 --", 0.5]
    keys = ["response_id", "score", "correction", "comment", "extra", "", "__proto__"]
    rng = random.Random(14)
    statuses = set()
    with httpx.Client(timeout=20, headers={"Authorization": "Bearer k-default"}) as client:
        for _ in range(300):
            body = {rng.choice(keys): rng.choice(values) for _ in range(rng.randint(0, 4))}
            if rng.random() < 0.5:
                body["response_id"] = rng.choice([real, "nope", real + "x"])
            reply = client.post(f"{running.url}/feedback", content=json.dumps(body))
            statuses.add(reply.status_code)
            assert reply.status_code < 500, (body, reply.text)
            if reply.status_code >= 400:
                assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert {200, 400, 404} <= statuses


async def test_a_from_traffic_run_stopped_by_its_budget_resumes_like_any_run(served):
    from gym_tf.optimize import resume_config

    clients, store, *_ = served
    problems = load_dataset("quickstart")[:8]
    send_quickstart_traffic(clients["acme"], problems)
    rows(store.root, 8, "acme")
    config = from_traffic(store, BASE.model_copy(update={"max_tokens": 300}), tenant="acme", val_fraction=0.5)
    backend = LibraryMatters({p.problem: p.answer for p in problems}, helps=True)
    stopped = await Optimizer(config, store, backend).run()
    assert stopped.status == "budget"
    assert promote_if_passed(store, stopped.run_id).version_id is None  # an unfinished run is never promoted
    run_id, again = resume_config(store, stopped.run_id, max_tokens=10**9)
    assert again.traffic == config.traffic and again.dataset == config.dataset
    finished = await Optimizer(again, store, backend, run_id=run_id).run()
    assert finished.status == "finished" and finished.run_id == stopped.run_id
    assert promote_if_passed(store, run_id).version_id == finished.library.id


def test_hostile_requests_with_recording_on_never_get_a_5xx_and_the_writer_survives(served):
    import random

    from test_server_hostile import assert_openai_error, hostile_body

    clients, store, _, running, recorder = served
    rng = random.Random(41)
    ok = 0
    with httpx.Client(base_url=running.url, timeout=20, headers={"Authorization": "Bearer k-default"}) as client:
        for _ in range(300):
            chat = rng.random() < 0.7
            reply = client.post("/chat/completions" if chat else "/completions", json=hostile_body(rng, chat))
            if reply.status_code >= 400:
                assert reply.status_code < 500, reply.text
                assert_openai_error(reply)
            else:
                ok += 1
    assert ok and recorder.writer.poll() is None
    real = clients["default"].chat.completions.create(model="m", messages=HI)
    assert feedback(clients["default"], response_id=real.id, score="up")["score"] == 1.0  # still taking feedback


async def test_an_optimize_run_in_the_same_workspace_is_not_disturbed_by_recording(tmp_path):
    """Recording commits as often as traffic allows; in the run store's own file that failed runs at once
    (`database is locked`: SQLITE_BUSY_SNAPSHOT on the store's deferred transactions)."""
    import asyncio
    import threading

    store = RunStore(tmp_path / "ws")
    process, url, _ = start_fake(tmp_path)
    running = Running(create_app(Upstream(url), store, None, Recorder(store.root, RecordSettings(flush_s=0.001))))
    client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0)
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            client.chat.completions.create(model="m", messages=HI)

    senders = [threading.Thread(target=traffic) for _ in range(6)]
    for sender in senders:
        sender.start()
    try:
        await asyncio.sleep(0.5)
        problems = load_dataset("quickstart")
        config = OptimizeConfig(dataset="quickstart", limit=16, batch_size=4, group_size=4, epochs=3, seed=1)
        result = await Optimizer(config, RunStore(store.root), ScriptedBackend(
            {p.problem: p.answer for p in problems})).run()
    finally:
        stop.set()
        for sender in senders:
            sender.join()
        running.stop()
        process.kill()
    assert result.status == "finished" and len(rows(store.root, 50, "default")) >= 50


def _write_runs_elsewhere(workspace, stop):
    from gym_tf.rollouts import Rollout

    store = RunStore(workspace)
    i = 0
    while not stop.is_set():
        i += 1
        store.put_rollouts("other", 0, i, [Rollout(problem_id=str(i), sample=0, messages=[], completion="x",
                                                   finish_reason="stop", prompt_tokens=1, completion_tokens=1,
                                                   latency_s=0.0)])
        store.put_learner_call("other", i, "summarize", "s", 0, messages=[], reply="r", prompt_tokens=1,
                               completion_tokens=1, valid=1, error=None)
        time.sleep(0.002)


def test_two_processes_writing_one_run_store_never_fail(tmp_path):
    """`learn --watch` and a hand-started optimize may share a workspace: the store's writes take the lock first."""
    import multiprocessing

    from gym_tf.rollouts import Rollout

    store = RunStore(tmp_path / "ws")
    stop = multiprocessing.Event()
    other = multiprocessing.Process(target=_write_runs_elsewhere, args=(tmp_path / "ws", stop))
    other.start()
    try:
        time.sleep(0.5)
        for i in range(300):
            store.put_rollouts("run", 0, i, [Rollout(problem_id=str(i), sample=0, messages=[], completion="x",
                                                     finish_reason="stop", prompt_tokens=1, completion_tokens=1,
                                                     latency_s=0.0)])
            store.put_learner_call("run", i, "summarize", "s", 0, messages=[], reply="r", prompt_tokens=1,
                                   completion_tokens=1, valid=1, error=None)
    finally:
        stop.set()
        other.join(30)
    assert other.exitcode == 0
    assert store.db["rollouts"].count_where("run_id = 'other'") > 10


def test_two_replicas_recording_apart_merge_into_one_learning_workspace(tmp_path):
    """Replicas without a shared disk: each records on its own; `gym-tf traffic merge` takes both into the learning
    workspace, once (merging again adds nothing), feedback included, the newer of two rows by one key winning."""
    import subprocess
    import sys

    process, url, _ = start_fake(tmp_path)
    replicas = []
    try:
        for name in ("a", "b"):
            store = RunStore(tmp_path / name)
            recorder = Recorder(store.root, RecordSettings())
            running = Running(create_app(Upstream(url), store, ServerConfig(api_keys=["k"]), recorder))
            replicas.append((store, recorder, running, openai.OpenAI(base_url=running.url, api_key="k", max_retries=0)))
        ids = {}
        for (store, _, _, client), count in zip(replicas, (3, 2)):
            ids[store.root] = [client.chat.completions.create(model="m", messages=HI).id for _ in range(count)]
            assert len(rows(store.root, count)) == count
        (a, _, _, client_a), (b, _, _, client_b) = replicas
        feedback(client_a, response_id=ids[a.root][0], score="up")
        feedback(client_b, response_id=ids[b.root][1], correction="42")
        time.sleep(0.5)  # the writer process takes feedback off the request path
    finally:
        for _, recorder, running, _ in replicas:
            running.stop()
            recorder.close()
        process.kill()
        process.wait()

    learner = tmp_path / "learner"
    merge = [sys.executable, "-m", "gym_tf", "traffic", "merge", str(tmp_path / "a"), str(tmp_path / "b"),
             "--workspace", str(learner)]
    first = subprocess.run(merge, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "3 exchanges and 1 feedback" in first.stdout and "2 exchanges and 1 feedback" in first.stdout
    again = subprocess.run(merge, capture_output=True, text=True, timeout=120)
    assert again.stdout.count("0 exchanges and 0 feedback") == 2, again.stdout
    merged = list(TrafficLog(learner).exchanges("default"))
    assert sorted(e["response_id"] for e in merged) == sorted(ids[a.root] + ids[b.root])
    with_feedback = {e["response_id"]: e["feedback"][0] for e in merged if e["feedback"]}
    assert with_feedback[ids[a.root][0]]["score"] == 1.0 and with_feedback[ids[b.root][1]]["correction"] == "42"
    own = subprocess.run([sys.executable, "-m", "gym_tf", "traffic", "merge", str(learner), "--workspace", str(learner)],
                         capture_output=True, text=True, timeout=120)
    assert own.returncode == 1 and "own traffic" in own.stderr
