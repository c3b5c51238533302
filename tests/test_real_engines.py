"""End to end against real engines: the embedded GGUF in-process and llama-cpp-python's OpenAI-compatible server."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import run_cli
from gym_tf.backends import BackendConfig, make_backend
from gym_tf.backends.embedded import EmbeddedBackend
from gym_tf.backends.openai_http import OpenAIBackend
from gym_tf.config import OptimizeConfig, RolloutConfig
from gym_tf.errors import ModelNotFound
from gym_tf.library import OpsReply, ops_schema
from gym_tf.optimize import Optimizer
from gym_tf.store import RunStore

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def embedded(embedded_model_path):
    return EmbeddedBackend(embedded_model_path)


async def test_embedded_backend_generates_a_group_with_usage(embedded):
    generation = await embedded.generate([{"role": "user", "content": "What is 2+3? Answer with a number."}],
                                         n=2, temperature=0.7, max_tokens=16, seed=1)
    assert len(generation.choices) == 2
    assert all(c.text and c.finish_reason in ("stop", "length") for c in generation.choices)
    assert generation.completion_tokens == sum(c.completion_tokens for c in generation.choices) > 0
    assert generation.prompt_tokens > 0


async def test_embedded_backend_follows_the_ops_schema(embedded):
    generation = await embedded.generate(
        [{"role": "user", "content": "Give one general lesson for solving percentage problems."}],
        n=1, temperature=0.3, max_tokens=200, json_schema=ops_schema(2),
    )
    reply = OpsReply.model_validate_json(generation.choices[0].text)
    assert 1 <= len(reply.operations) <= 2


async def test_openai_backend_against_a_server_that_ignores_n(llama_server):
    backend = OpenAIBackend(llama_server)
    await backend.check()
    assert backend.model == "qwen-0.5b"
    generation = await backend.generate([{"role": "user", "content": "Say one word."}], n=3, max_tokens=8, seed=5)
    assert len(generation.choices) == 3 and backend.supports_n is False
    assert generation.completion_tokens == sum(c.completion_tokens for c in generation.choices) > 0
    # the learner's JSON request falls back to the form this server accepts, and the reply parses
    ops = await backend.generate([{"role": "user", "content": "Propose one lesson as library operations."}],
                                 max_tokens=200, temperature=0.2, json_schema=ops_schema(2))
    OpsReply.model_validate_json(ops.choices[0].text)
    assert backend.schema_modes == ["json_object"]
    await backend.aclose()


async def test_unknown_model_names_what_the_server_serves(llama_server):
    with pytest.raises(ModelNotFound, match=r"does not serve model 'gpt-9'; it serves \['qwen-0.5b'\]"):
        await make_backend(BackendConfig(base_url=llama_server, model="gpt-9"))


def test_eval_cli_on_the_embedded_model(tmp_path):
    report = tmp_path / "report.json"
    result = run_cli("eval", "--dataset", "quickstart", "--limit", "3", "-k", "2", "--max-completion-tokens", "160",
                     "--report", str(report), "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 0, result.stderr
    for metric in ("Mean@2", "Pass@2", "Majority@2", "95% CI"):
        assert metric in result.stdout
    data = json.loads(report.read_text())
    assert data["metrics"]["problems"] == 3 and data["model"] == "qwen2.5-coder-0.5b-instruct-q4"
    assert 0 <= data["metrics"]["mean_at_k"]["low"] <= data["metrics"]["mean_at_k"]["value"] <= data["metrics"]["mean_at_k"]["high"]


def test_eval_cli_against_a_real_openai_compatible_server(llama_server, tmp_path):
    report = tmp_path / "report.json"
    result = run_cli("eval", "--base-url", llama_server, "--dataset", "quickstart", "--limit", "2", "-k", "2",
                     "--max-completion-tokens", "128", "--report", str(report), "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 0, result.stderr
    assert "Mean@2" in result.stdout and json.loads(report.read_text())["model"] == "qwen-0.5b"


TINY = dict(dataset="quickstart", limit=4, batch_size=2, group_size=2, epochs=1, seed=0,
            rollout=RolloutConfig(max_completion_tokens=96))


async def test_optimize_end_to_end_on_the_embedded_model(embedded, tmp_path):
    store = RunStore(tmp_path / "ws")
    result = await Optimizer(OptimizeConfig(**TINY), store, embedded).run()
    assert result.status == "finished"
    assert len(store.rollouts(result.run_id)) == 8
    usage = store.usage(result.run_id)
    assert usage["rollout"]["completion"] > 0
    assert sum(s["stats"]["groups_used"] + s["stats"]["groups_skipped"] for s in store.steps(result.run_id)) == 4


async def test_real_learner_prompted_badly_leaves_no_corrupt_version(embedded, tmp_path):
    """5 tokens cannot hold even the shortest valid reply ({"operations":[{"op":"none"}]}): every reply is truncated
    JSON, retried, then rejected."""
    store = RunStore(tmp_path / "ws")
    config = OptimizeConfig(**{**TINY, "learner_max_tokens": 5, "max_attempts": 2, "summarize": False,
                               "hard_groups": "reference"})
    result = await Optimizer(config, store, embedded).run()
    assert result.library.items == () and store.versions(result.run_id) == []
    rejected = [o for o in store.ops(result.run_id) if not o["accepted"]]
    assert len(rejected) == result.progress.groups_used > 0
    calls = list(store.db["learner_calls"].rows)
    assert all(c["valid"] == 0 and c["error"] for c in calls) and {c["attempt"] for c in calls} == {0, 1}


def test_kill_9_and_resume_with_the_real_cli(tmp_path):
    ws = tmp_path / "ws"
    args = ["optimize", "--dataset", "quickstart", "--limit", "4", "--batch-size", "2", "--epochs", "1", "-G", "2",
            "--max-completion-tokens", "64", "--no-summarize", "--workspace", str(ws)]
    child = subprocess.Popen([sys.executable, "-m", "gym_tf", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    store = RunStore(ws)
    while time.time() < deadline and store.db["rollouts"].count < 2:
        time.sleep(0.2)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    [run] = store.runs()
    assert run["status"] == "running" and len(store.steps(run["id"])) < 2
    before = {r["key"]: r["completion"] for r in store.db["rollouts"].rows}
    resumed = run_cli("optimize", "--resume", run["id"][-6:], "--workspace", str(ws))
    assert resumed.returncode == 0, resumed.stderr
    after = {r["key"]: r["completion"] for r in store.db["rollouts"].rows}
    assert len(after) == 8 and all(after[k] == v for k, v in before.items())
    assert store.run(run["id"])["status"] == "finished" and len(store.steps(run["id"])) == 2
