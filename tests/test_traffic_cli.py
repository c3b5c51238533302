"""Issue #14 through the command line: `gym-tf serve --record --tenants` in its own process, the official openai
client sending traffic and feedback, `gym-tf optimize --from-traffic --promote` against a real HTTP model server,
and the running server switching the tenant's library with no restart while the other tenant sees none of it."""

import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import free_port, run_cli, wait_for
from gym_tf.datasets import load_dataset
from gym_tf.library import EMPTY_LIBRARY

TESTS = Path(__file__).parent


@contextlib.contextmanager
def serving(tmp_path, model_url):
    """`gym-tf serve --record --tenants` in its own process in front of `model_url`; openai clients per tenant."""
    port = free_port()
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenant.acme]\nkeys = ["k-acme"]\n\n[tenant.globex]\nkeys = ["k-globex"]\n')
    workspace = tmp_path / "ws"
    server = subprocess.Popen([sys.executable, "-m", "gym_tf", "serve", "--upstream", model_url, "--record",
                               "--tenants", str(tenants), "--api-key", "k-default", "--port", str(port),
                               "--workspace", str(workspace)])
    try:
        wait_for(f"http://127.0.0.1:{port}/health", server, 60)
        yield {t: openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=f"k-{t}", max_retries=0)
               for t in ("acme", "globex", "default")}, workspace
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def production(tmp_path):
    model_port = free_port()
    model = subprocess.Popen([sys.executable, str(TESTS / "fake_model_server.py"), str(model_port)])
    model_url = f"http://127.0.0.1:{model_port}/v1"
    try:
        wait_for(f"{model_url}/models", model, 30)
        with serving(tmp_path, model_url) as (clients, workspace):
            yield clients, workspace, model_url
    finally:
        model.terminate()
        model.wait(timeout=30)


def version_of(client, text="What is 6 times 7?"):
    reply = client.chat.completions.with_raw_response.create(model="m", max_tokens=16,
                                                             messages=[{"role": "user", "content": text}])
    return reply.headers["x-gym-tf-library-version"]


def test_serve_record_feedback_learn_promote_and_isolate(production):
    clients, workspace, model_url = production
    acme = clients["acme"]
    problems = load_dataset("quickstart")[:16]
    for i, p in enumerate(problems):
        reply = acme.chat.completions.create(model="m", messages=[{"role": "user", "content": p.problem}])
        if i < 12:  # the user corrects most answers; the rest get no feedback
            acme.post("/feedback", body={"response_id": reply.id, "correction": p.answer, "score": "down"},
                      cast_to=httpx.Response)
    clients["globex"].chat.completions.create(model="m", messages=[{"role": "user", "content": "globex secret 7"}])
    stats = json.loads(run_cli("traffic", "stats", "--tenant", "acme", "--workspace", str(workspace)).stdout)
    assert stats == {"tenant": "acme", "exchanges": 16, "feedback": 12}

    learned = run_cli("optimize", "--from-traffic", "--tenant", "acme", "--val-fraction", "0.4", "--promote",
                      "--base-url", model_url, "--model", "fake-frozen", "--epochs", "1", "--batch-size", "8",
                      "-G", "4", "--val-samples", "4", "--workspace", str(workspace), env={"OPENAI_MAX_RETRIES": "0"})
    assert learned.returncode == 0, learned.stderr
    assert "to tenant 'acme'" in learned.stdout, learned.stdout
    promoted = learned.stdout.split("serving ", 1)[1].split()[0]

    # the running server answers acme with it at once; globex and the default keys are untouched
    assert version_of(acme) == promoted
    assert version_of(clients["globex"]) == EMPTY_LIBRARY.id
    assert version_of(clients["default"]) == EMPTY_LIBRARY.id
    refused = run_cli("library", "promote", promoted, "--tenant", "globex", "--workspace", str(workspace))
    assert refused.returncode == 1 and "another tenant" in refused.stderr
    snapshot = next((workspace / "traffic-snapshots").glob("acme-*-train.jsonl")).read_text()
    assert "globex secret" not in snapshot
    assert run_cli("ledger", "verify", "--workspace", str(workspace)).returncode == 0

    # the kill switch, from the command line
    assert run_cli("traffic", "pause", "--workspace", str(workspace)).returncode == 0
    time.sleep(1.2)
    version_of(acme)
    assert run_cli("traffic", "resume", "--workspace", str(workspace)).returncode == 0
    time.sleep(1.2)
    version_of(acme)
    time.sleep(0.5)
    stats = json.loads(run_cli("traffic", "stats", "--tenant", "acme", "--workspace", str(workspace)).stdout)
    assert stats["exchanges"] == 16 + 1 + 1  # the check after promotion and the one after resume, not the paused one


def test_learn_once_then_watch_for_new_feedback(production):
    clients, workspace, model_url = production
    acme = clients["acme"]
    problems = load_dataset("quickstart")[:16]
    ids = [acme.chat.completions.create(model="m", messages=[{"role": "user", "content": p.problem}]).id
           for p in problems]

    def correct(indices):
        for i in indices:
            acme.post("/feedback", body={"response_id": ids[i], "correction": problems[i].answer}, cast_to=httpx.Response)

    correct(range(10))
    model = ["--base-url", model_url, "--model", "fake-frozen", "--batch-size", "8", "-G", "4"]
    once = run_cli("learn", "--tenant", "acme", "--val-fraction", "0.4", *model, "--workspace", str(workspace))
    assert once.returncode == 0 and "to tenant 'acme'" in once.stdout, once.stderr
    first = once.stdout.split("serving ", 1)[1].split()[0]
    assert version_of(acme) == first
    correct(range(10, 13))  # three new feedback rows since that run
    watched = run_cli("learn", "--watch", "--rounds", "1", "--min-feedback", "3", "--interval", "0.2", "--tenant",
                      "acme", "--val-fraction", "0.4", *model, "--workspace", str(workspace), timeout=120)
    assert watched.returncode == 0, watched.stderr
    assert re.search(r"^run \S+: (serving \S+ to tenant 'acme'|no candidate passed|version \S+ scores)", watched.stderr,
                     re.MULTILINE), watched.stderr  # one learning run, started by the 3 new rows, and its verdict
    unguarded = run_cli("learn", "--tenant", "acme", "--val-fraction", "0", *model, "--workspace", str(workspace))
    assert unguarded.returncode == 1 and "learn always gates" in unguarded.stderr


def test_a_bad_redaction_hook_or_tenants_file_is_a_one_line_error(tmp_path):
    bad = run_cli("serve", "--record", "--redact", "nowhere_module:f", "--upstream", "http://127.0.0.1:9/v1",
                  "--workspace", str(tmp_path / "ws"))
    assert bad.returncode == 1 and bad.stderr.startswith("error: --redact 'nowhere_module:f': cannot import")
    tenants = tmp_path / "t.toml"
    tenants.write_text('[tenant.default]\nkeys = ["k"]\n')
    bad = run_cli("serve", "--tenants", str(tenants), "--upstream", "http://127.0.0.1:9/v1", "--workspace",
                  str(tmp_path / "ws"))
    assert bad.returncode == 1 and "must be letters" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_the_same_path_against_the_embedded_model_behind_llama_server(llama_server, tmp_path):
    """The real thing: llama.cpp's server with the embedded model is the upstream and the frozen model. Which way
    the gate goes is the model's business; the test holds the promises that do not depend on it."""
    with serving(tmp_path, llama_server) as (clients, workspace):
        acme = clients["acme"]
        problems = load_dataset("quickstart")[:6]
        for i, p in enumerate(problems):
            reply = acme.chat.completions.create(model="qwen-0.5b", max_tokens=96,
                                                 messages=[{"role": "user", "content": p.problem}])
            assert reply.choices[0].message.content  # the real model answered, through the proxy
            if i < 4:
                acme.post("/feedback", body={"response_id": reply.id, "correction": p.answer}, cast_to=httpx.Response)
        clients["globex"].chat.completions.create(model="qwen-0.5b", max_tokens=8,
                                                  messages=[{"role": "user", "content": "globex secret 7"}])
        stats = json.loads(run_cli("traffic", "stats", "--tenant", "acme", "--workspace", str(workspace)).stdout)
        assert stats == {"tenant": "acme", "exchanges": 6, "feedback": 4}

        learned = run_cli("optimize", "--from-traffic", "--tenant", "acme", "--val-fraction", "0.5", "--promote",
                          "--base-url", llama_server, "--model", "qwen-0.5b", "--epochs", "1", "--batch-size", "4",
                          "-G", "2", "--val-samples", "1", "--max-completion-tokens", "128",
                          "--workspace", str(workspace))
        assert learned.returncode == 0, learned.stderr
        verdict = re.search(r"^(serving (\S+) to tenant 'acme'|no candidate passed the gate|version \S+ scores .* "
                            r"below the start library's)", learned.stdout, re.MULTILINE)
        assert verdict, learned.stdout
        expected = verdict.group(2) or EMPTY_LIBRARY.id  # a promoted version is served at once; otherwise nothing moved
        assert version_of(acme) == expected
        assert version_of(clients["globex"]) == EMPTY_LIBRARY.id
        assert version_of(clients["default"]) == EMPTY_LIBRARY.id
        snapshot = next((workspace / "traffic-snapshots").glob("acme-*-train.jsonl")).read_text()
        assert "globex secret" not in snapshot
        assert run_cli("ledger", "verify", "--workspace", str(workspace)).returncode == 0
