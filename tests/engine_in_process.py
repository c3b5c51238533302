"""The embedded engine in this process. Not collected by the main run: tests/test_real_engines.py runs this module in
a child pytest, so a crash in native code (a segfault in llama.cpp) fails one test instead of killing the run."""

import ast
import asyncio
import json
import os
import subprocess
import sys
import threading

import jsonschema
import pytest

from gym_tf.backends.embedded import EmbeddedBackend, cache_dir
from gym_tf.config import OptimizeConfig, RolloutConfig
from gym_tf.library import ops_schema
from gym_tf.optimize import Optimizer
from gym_tf.store import RunStore

TINY = dict(dataset="quickstart", limit=4, batch_size=2, group_size=2, epochs=1, seed=0,
            rollout=RolloutConfig(max_completion_tokens=96))


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


async def test_a_group_larger_than_the_slots_decodes_in_batches_with_each_samples_own_count(embedded_model_path):
    backend = EmbeddedBackend(embedded_model_path, n_ctx=1024, slots=2)
    try:
        generation = await backend.generate([{"role": "user", "content": "Write a long story about a lighthouse."}],
                                            n=5, temperature=1.0, max_tokens=12, seed=3)
        short = await backend.generate([{"role": "user", "content": "Say yes."}], n=2, temperature=0.7,
                                       max_tokens=64, seed=3)
        single = await backend.generate([{"role": "user", "content": "Say yes."}], n=1, max_tokens=4, seed=3)
    finally:
        await backend.aclose()
    assert len(generation.choices) == 5  # requests of 2, 2 and 1
    # every sample ran to the limit, and counts it: llama.cpp's usage of a request counts its first sample only
    assert [(c.finish_reason, c.completion_tokens) for c in generation.choices] == [("length", 12)] * 5
    assert generation.completion_tokens == 60
    assert len({c.text for c in generation.choices}) > 1  # each request's samples and seeds differ
    # an answer that stops early counts its own tokens, not the limit
    assert all(c.finish_reason == "stop" and 0 < c.completion_tokens < 64 for c in short.choices)
    assert short.prompt_tokens == 2 * single.prompt_tokens > 0  # the prompt, as each sample read it


async def test_concurrent_requests_share_the_slots_each_answered_on_its_own_prompt(embedded_model_path):
    """Two pairs and two single replies at once on a 4-slot engine (what validation and the learner send): each
    reply belongs to its own request, with its own sample count and prompt."""
    backend = EmbeddedBackend(embedded_model_path, n_ctx=1024, slots=4)
    words = ["apple", "river", "seven", "violin"]
    in_flight, peak, count = [0], [0], threading.Lock()
    complete = backend._complete

    def counted(request):
        with count:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        try:
            return complete(request)
        finally:
            with count:
                in_flight[0] -= 1
    backend._complete = counted

    def ask(word):
        return [{"role": "user", "content": f"Repeat this word exactly: {word}"}]
    try:
        alone = [await backend.generate(ask(w), n=1, temperature=0.0, max_tokens=16, seed=1) for w in words]
        assert peak[0] == 1
        together = await asyncio.gather(*(backend.generate(ask(w), n=n, temperature=0.0, max_tokens=16, seed=1)
                                          for w, n in zip(words, (2, 2, 1, 1))))
    finally:
        await backend.aclose()
    assert [len(g.choices) for g in together] == [2, 2, 1, 1]
    for word, one, generation in zip(words, alone, together):
        assert all(word in c.text.lower() for c in generation.choices), (word, generation.choices)
        assert generation.prompt_tokens == one.prompt_tokens * len(generation.choices)
    assert peak[0] >= 2  # requests decoded side by side, not one at a time
    assert backend._slots.free == 4


async def test_a_running_engine_is_seen_by_other_processes_until_it_closes(embedded, embedded_model_path):
    """What lets a second `gym-tf optimize` on the machine warn that two engines on the same cores thrash."""
    def threads_seen_elsewhere() -> int:
        seen = subprocess.run([sys.executable, "-c", "from gym_tf.backends import core_claims, embedded; "
                               "print(core_claims.engines_elsewhere(embedded.cache_dir()))"],
                              capture_output=True, text=True, check=True)
        return ast.literal_eval(seen.stdout).get(os.getpid(), 0)

    cores = os.cpu_count()
    assert threads_seen_elsewhere() == cores  # the module's engine
    backend = EmbeddedBackend(embedded_model_path, n_ctx=256, slots=1, threads=1)
    claim = backend._claim.path
    assert claim.parent == cache_dir() / "engines" and claim.read_text() == "1\n"
    assert threads_seen_elsewhere() == cores + 1
    await backend.aclose()
    assert not claim.exists() and threads_seen_elsewhere() == cores


async def test_embedded_backend_follows_the_ops_schema(embedded):
    generation = await embedded.generate(
        [{"role": "user", "content": "Give one general lesson for solving percentage problems."}],
        n=1, temperature=0.3, max_tokens=200, json_schema=ops_schema(2),
    )
    # The grammar holds the schema's shape. The lesson rule (10 letters of advice) is no grammar's to hold: the learner
    # enforces it by retry (tests/test_optimize.py, the '8 + 32 = 40' case), so it is not asked of the raw reply here.
    reply = json.loads(generation.choices[0].text)
    jsonschema.validate(reply, ops_schema(2))
    operations = reply["operations"]
    assert 1 <= len(operations) <= 2


@pytest.mark.parametrize("ids", [(), ("E1", "E2")])
async def test_embedded_backend_names_only_the_librarys_ids(embedded, ids):
    """Told to update an id that does not exist (what a 1.5B learner did on an empty library), the grammar of the
    narrowed schema lets the model name only the library's lessons, or add when it has none."""
    schema = ops_schema(1, ids)
    generation = await embedded.generate(
        [{"role": "user", "content": 'Reply with JSON: update the lesson with id "attempt2" to say "Check each step '
                                     'before the next one."'}],
        n=1, temperature=0.3, max_tokens=120, json_schema=schema,
    )
    reply = json.loads(generation.choices[0].text)
    jsonschema.validate(reply, schema)
    [op] = reply["operations"]
    assert op["op"] in (("add", "none") if not ids else ("add", "none", "update", "delete"))
    assert op.get("id") in (None, *ids)


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
                               "hard_groups": "reference", "worked_examples": False})
    result = await Optimizer(config, store, embedded).run()
    assert result.library.items == () and store.versions(result.run_id) == []
    rejected = [o for o in store.ops(result.run_id) if not o["accepted"]]
    assert len(rejected) == result.progress.groups_used > 0
    calls = list(store.db["learner_calls"].rows)
    assert all(c["valid"] == 0 and c["error"] for c in calls) and {c["attempt"] for c in calls} == {0, 1}



async def test_the_python_tool_runs_the_embedded_model_s_programs_and_it_answers_from_their_output(embedded):
    """The real loop on a count_bits problem, sampled as the benchmark samples: the 0.5B writes programs, a child
    Python runs them, and the output shown to it is what the program prints; shown it, the model boxes the count."""
    from gym_tf.prompts import template
    from gym_tf.python_tool import PythonTool, last_program, run_program
    from rewards.reasoning_gym import final_answer

    asked = [{"role": "system", "content": template("solve_system")},
             {"role": "user", "content": "How many 1 bits are in the binary representation of 656? Count them with a Python program."}]
    replies = [c.text for c in (await PythonTool(embedded).generate(asked, n=4, temperature=0.7, max_tokens=256,
                                                                    seed=5)).choices]
    ran = [r for r in replies if "\n\nThe program printed:\n```\n" in r]
    assert ran, replies
    for reply in ran:
        program, _ = last_program(reply.split("\n\nThe program printed:")[0])
        shown = reply.split("The program printed:\n```\n", 1)[1].split("\n```", 1)[0]
        assert shown == await run_program(program), reply
    assert "3" in [final_answer(r) for r in ran], replies  # 656 = 0b1010010000
