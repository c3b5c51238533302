"""End to end against real engines: the embedded GGUF in-process and llama.cpp's own OpenAI-compatible server."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from conftest import free_port, run_cli, wait_for
from gym_tf.backends import BackendConfig, make_backend
from gym_tf.backends.openai_http import OpenAIBackend
from gym_tf.errors import ModelNotFound
from gym_tf.library import ops_schema
from gym_tf.store import RunStore

pytestmark = pytest.mark.embedded


async def test_openai_backend_against_a_server_that_refuses_n(llama_server):
    backend = OpenAIBackend(llama_server)
    await backend.check()
    assert backend.model == "qwen-0.5b"
    generation = await backend.generate([{"role": "user", "content": "Say one word."}], n=3, max_tokens=8, seed=5)
    assert len(generation.choices) == 3 and backend.supports_n is False
    assert generation.completion_tokens == sum(c.completion_tokens for c in generation.choices) > 0
    assert len({c.text for c in generation.choices}) > 1  # one seed per request: the group is not one answer thrice
    # the learner's JSON request is constrained by the schema: the reply holds its shape. The lesson rule (10 letters
    # of advice) is no grammar's to hold; the learner enforces it by retry (tests/test_optimize.py, '8 + 32 = 40')
    ops = await backend.generate([{"role": "user", "content": "Propose one lesson as library operations."}],
                                 max_tokens=200, temperature=0.2, json_schema=ops_schema(2))
    jsonschema.validate(json.loads(ops.choices[0].text), ops_schema(2))
    assert backend.schema_modes == ["json_schema", "json_object"]
    await backend.aclose()


async def test_llama_servers_usage_of_a_group_is_counted_per_choice(embedded_model_path):
    """llama.cpp's server with several slots (llama-server's own default is 4) answers n > 1 in one reply, whose
    usage counts the first choice alone: the backend learns it from the first group and counts each choice after."""
    port = free_port()
    server = subprocess.Popen([sys.executable, str(Path(__file__).parent / "llama_server.py"), str(embedded_model_path),
                               str(port), "qwen-0.5b", "4"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{port}/health", server)
        backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "qwen-0.5b", max_retries=0)
        long = [{"role": "user", "content": "Count from 1 to 100, separated by commas."}]  # every answer cut at 6
        first = await backend.generate(long, n=4, max_tokens=6, seed=1)
        assert backend.supports_n is True and backend.counts_each_choice is False
        assert [c.finish_reason for c in first.choices] == ["length"] * 4 and first.completion_tokens == 24
        later = await backend.generate([{"role": "user", "content": "Say yes or no."}], n=4, max_tokens=24, seed=2)
        counts = [c.completion_tokens for c in later.choices]
        assert later.completion_tokens == sum(counts) and all(0 < k <= 24 for k in counts)
        assert [k == 24 for k in counts] == [c.finish_reason == "length" for c in later.choices]
        await backend.aclose()
    finally:
        server.terminate()
        server.wait(timeout=30)


async def test_unknown_model_names_what_the_server_serves(llama_server):
    with pytest.raises(ModelNotFound, match=r"does not serve model 'gpt-9'; it serves \['qwen-0.5b'\]"):
        await make_backend(BackendConfig(base_url=llama_server, model="gpt-9"))


def test_the_in_process_engine_cases_in_a_child_process():
    """engine_in_process.py loads llama.cpp into the test process: run it in a child pytest, so that a crash there
    fails here, with its output, instead of ending the whole run."""
    child = subprocess.run([sys.executable, "-m", "pytest", str(Path(__file__).parent / "engine_in_process.py"), "-q",
                            "-p", "no:cacheprovider"], capture_output=True, text=True, timeout=900)
    assert child.returncode == 0, f"exit {child.returncode}\n{child.stdout[-4000:]}\n{child.stderr[-2000:]}"
    assert re.search(r"^10 passed", child.stdout, re.MULTILINE), child.stdout[-2000:]  # none skipped


def test_eval_cli_on_the_embedded_model(tmp_path):
    report = tmp_path / "report.json"
    result = run_cli("eval", "--dataset", "quickstart", "--limit", "3", "-k", "2", "--max-completion-tokens", "160",
                     "--report", str(report), "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 0, result.stderr
    for metric in ("Mean@2", "Pass@2", "Majority@2", "95% CI"):
        assert metric in result.stdout
    assert re.search(r"^\[\s*\d+s\] eval library none \(\d+/3\)$", result.stderr, re.MULTILINE), result.stderr
    data = json.loads(report.read_text())
    assert data["metrics"]["problems"] == 3 and data["model"] == "qwen2.5-coder-0.5b-instruct-q4"
    assert 0 <= data["metrics"]["mean_at_k"]["low"] <= data["metrics"]["mean_at_k"]["value"] <= data["metrics"]["mean_at_k"]["high"]


def test_eval_cli_against_a_real_openai_compatible_server(llama_server, tmp_path):
    report = tmp_path / "report.json"
    result = run_cli("eval", "--base-url", llama_server, "--dataset", "quickstart", "--limit", "2", "-k", "2",
                     "--max-completion-tokens", "128", "--report", str(report), "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 0, result.stderr
    assert "Mean@2" in result.stdout and json.loads(report.read_text())["model"] == "qwen-0.5b"


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
    assert run["status"] == "crashed" and len(store.steps(run["id"])) < 2
    before = {r["key"]: r["completion"] for r in store.db["rollouts"].rows}
    resumed = run_cli("optimize", "--resume", run["id"][-6:], "--workspace", str(ws))
    assert resumed.returncode == 0, resumed.stderr
    # stderr is a pipe here, not a terminal: plain progress lines, one at least per step, with the elapsed time
    steps = [line for line in resumed.stderr.splitlines() if re.match(r"\[\s*\d+s\] epoch 1 step \d/2 ", line)]
    assert {re.search(r"step (\d)/2", line).group(1) for line in steps} >= {"2"}, resumed.stderr
    after = {r["key"]: r["completion"] for r in store.db["rollouts"].rows}
    assert len(after) == 8 and all(after[k] == v for k, v in before.items())
    assert store.run(run["id"])["status"] == "finished" and len(store.steps(run["id"])) == 2


def test_eval_compares_libraries_on_the_embedded_model(tmp_path):
    from gym_tf.library import EMPTY_LIBRARY, ExampleOp, apply_ops
    from gym_tf.library_io import export_library

    library, _ = apply_ops(EMPTY_LIBRARY, [ExampleOp(op="example", text="Problem: What is 6 times 7?\nSolution: "
                                                     "6 * 7 = 42. \\boxed{42}")], step=1)
    export_library(library, tmp_path / "lib.json")
    report = tmp_path / "report.json"
    result = run_cli("eval", "--dataset", "quickstart", "--limit", "2", "-k", "2", "--max-completion-tokens", "96",
                     "--library", "none", "--library", str(tmp_path / "lib.json"), "--report", str(report),
                     "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 0, result.stderr
    assert "Mean@2 - none" in result.stdout and "Majority@2 - none's" in result.stdout
    data = json.loads(report.read_text())
    none, learned = data["arms"]
    assert (none["name"], learned["name"]) == ("none", str(tmp_path / "lib.json"))
    assert none["mean_vs_baseline"] is None and learned["mean_vs_baseline"]["low"] <= learned["mean_vs_baseline"]["high"]
    assert data["extra_prompt_tokens_per_call"][learned["name"]] > 10  # the example is in every prompt
    assert all(r["shown"] == ["E1"] for g in data["reports"][learned["name"]]["problems"].values() for r in g)
    assert report.with_suffix(".png").stat().st_size > 1000
    # beside them, the most common answer (a tie of two: the first, '6') given to both problems, graded by math-verify
    assert data["constant_answer"] == {"answer": "6", "mean": 0.5} and "'6' always" in result.stdout
    assert learned["mean_vs_constant"]["low"] <= learned["mean_vs_constant"]["value"] <= learned["mean_vs_constant"]["high"]
    # and the library's gain on the problem '6' gets wrong (the other one), beside it in the table and the JSON
    assert "where '6' is wrong" in result.stdout
    where_wrong = learned["mean_vs_baseline_uncommon"]
    assert where_wrong["low"] <= where_wrong["value"] <= where_wrong["high"] and none["mean_vs_baseline_uncommon"] is None
    # and how many of the library's 4 answers wrote its worked example again (the none arm was shown none)
    copied = learned["copies"]
    assert copied["of"] == 4 and none["copies"] is None and copied["share"] == copied["copied"] / 4
    assert re.search(rf"answers copying an example\s.*{copied['copied']} of 4 ", result.stdout)


def test_told_the_answer_the_embedded_model_answers_again_and_only_a_verified_answer_can_be_its_example(tmp_path):
    """`--hinted-examples` with the real engine: products the 0.5B gets wrong, then answers told the reference
    answer. Each told answer is stored with the hint in its prompt and its tokens counted on their own; an example
    from one is verified, says nothing of the hint and shows the problem as asked."""
    rows = [{"id": f"big-{i}", "problem": f"What is {a} times {b}?", "answer": str(a * b)}
            for i, (a, b) in enumerate([(982451653, 57885161), (70368760954879, 2305843009)])]
    dataset = tmp_path / "big.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    ws = tmp_path / "ws"
    result = run_cli("optimize", "--dataset", str(dataset), "--batch-size", "2", "--epochs", "1", "-G", "2",
                     "--max-completion-tokens", "96", "--hinted-examples", "2", "--workspace", str(ws))
    assert result.returncode == 0, result.stderr
    store = RunStore(ws)
    [run] = store.runs()
    own = [r for r in store.rollouts(run["id"]) if not r.problem_id.startswith("hinted/")]
    told = [r for r in store.rollouts(run["id"]) if r.problem_id.startswith("hinted/")]
    unshown = {r.problem_id for r in own if (r.reward or 0) < 1} - {r.problem_id for r in own if r.reward == 1}
    assert unshown  # the model got these products wrong every time, so it was told them
    assert {r.problem_id.removeprefix("hinted/") for r in told} >= unshown and len(told) % 2 == 0
    answers = {r["id"]: r["answer"] for r in rows}
    for r in told:
        assert f"The correct final answer is {answers[r.problem_id.removeprefix('hinted/')]}." in r.messages[-1]["content"]
    assert store.usage(run["id"])["hinted-answer"]["completion"] > 0
    by_key = {r["key"]: r for r in store.db["rollouts"].rows}
    current = store.run(run["id"])["current_version"]
    for item in store.version(current).items if current else ():
        [key] = item.provenance.rollout_ids
        if "/hinted/" in key:
            assert by_key[key]["reward"] == 1.0 and "correct final answer" not in item.text
            assert item.text.startswith(f"Problem: {next(r['problem'] for r in rows if r['id'] in key)}\n")
