"""The CLI's own behaviour: help text, one-line errors, inspection commands on a real store."""

import asyncio
import json

import pytest
import typer.main

from conftest import free_port, run_cli
from fakes import ScriptedBackend
from gym_tf.cli import app
from gym_tf.config import OptimizeConfig
from gym_tf.datasets import load_dataset
from gym_tf.library import RenderPolicy, example_parts, short, with_policy
from gym_tf.optimize import Optimizer
from gym_tf.store import RunStore


def test_every_command_has_help_text():
    group = typer.main.get_command(app)

    def walk(command, path):
        assert command.help, f"{path} has no help text"
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(group, "gym-tf")


def test_malformed_dataset_line_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "oops"\n')
    result = run_cli("eval", "--dataset", str(bad), "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {bad}:line 2: invalid JSON (Expecting ','")


def test_dead_base_url_is_one_line_error_naming_it(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    result = run_cli("eval", "--base-url", url, "--limit", "1", "--workspace", str(tmp_path / "ws"),
                     env={"OPENAI_MAX_RETRIES": "0"})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot reach {url}")


def test_learner_model_file_runs_on_the_embedded_engine_even_beside_a_server(tmp_path, llama_server):
    """`--learner-model-file` gives the learning stages their own local GGUF; with a policy server named, the learner
    goes to the embedded engine, not to that server (which would have answered). A missing file is named."""
    missing = tmp_path / "bigger-learner.gguf"
    result = run_cli("optimize", "--learner-model-file", str(missing), "--base-url", llama_server, "--limit", "1",
                     "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line == f"error: model file {missing} does not exist"


def test_bad_setting_is_one_line_error(tmp_path):
    result = run_cli("optimize", "--group-size", "1", "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 1
    assert "group_size must be >= 2 to compare rollouts" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.fixture
def trained_workspace(tmp_path):
    store = RunStore(tmp_path / "ws")
    backend = ScriptedBackend({p.problem: p.answer for p in load_dataset("quickstart")})
    config = OptimizeConfig(dataset="quickstart", limit=8, batch_size=4, group_size=4, epochs=1, seed=1)
    result = asyncio.run(Optimizer(config, store, backend).run())
    return tmp_path / "ws", result


def test_runs_library_show_diff_export_import(trained_workspace, tmp_path):
    ws, result = trained_workspace
    runs = run_cli("runs", "--workspace", str(ws))
    assert runs.returncode == 0 and result.run_id in runs.stdout and "finished" in runs.stdout

    show = run_cli("library", "show", "--workspace", str(ws))
    assert show.returncode == 0 and short(result.library.id) in show.stdout
    rendered = run_cli("library", "show", result.library.id[:14], "--rendered", "--workspace", str(ws))
    assert rendered.stdout.startswith("Experiences learned from earlier problems")
    lessons = [i for i in result.library.items if i.kind == "lesson"]
    examples = [i for i in result.library.items if i.kind == "example"]
    assert lessons and examples and all(f"[{i.id}] {i.text}" in rendered.stdout for i in lessons)
    # with no problem to match, the policy's two newest worked examples
    assert [i.id for i in examples if f"[{i.id}] " in rendered.stdout] == [i.id for i in examples[-2:]]

    # a version that shows its examples as turns prints the messages a request gets before its own
    turns = with_policy(result.library, RenderPolicy(examples_as_turns=True))
    RunStore(ws).put_version(turns, run_id=result.run_id, status="candidate")
    shown = run_cli("library", "show", turns.id[:20], "--rendered", "--workspace", str(ws)).stdout
    problem, solution = example_parts(examples[-1].text)
    assert shown.startswith("[system]\nExperiences learned from earlier problems") and f"[{examples[-1].id}]" not in shown
    assert f"[user]\n{problem}\n\n[assistant]\n{solution}" in shown

    diff = run_cli("library", "diff", "empty", short(result.library.id), "--workspace", str(ws))
    assert diff.returncode == 0 and f"ops applied ({len(result.library.items)})" in diff.stdout

    exported = tmp_path / "lib.json"
    assert run_cli("library", "export", short(result.library.id), "-o", str(exported), "--workspace", str(ws)).returncode == 0
    fresh = tmp_path / "fresh"
    imported = run_cli("library", "import", str(exported), "--workspace", str(fresh))
    assert imported.returncode == 0 and result.library.id in imported.stdout
    assert RunStore(fresh).version(result.library.id) == result.library

    document = json.loads(exported.read_text())
    document["library"]["items"][0]["text"] = "Tampered lesson text."
    exported.write_text(json.dumps(document))
    refused = run_cli("library", "import", str(exported), "--workspace", str(fresh))
    assert refused.returncode == 1 and "content hashes to" in refused.stderr


def test_unknown_version_is_one_line_error(trained_workspace):
    ws, _ = trained_workspace
    result = run_cli("library", "show", "deadbeef", "--workspace", str(ws))
    assert result.returncode == 1 and result.stderr.strip() == "error: no library version 'deadbeef'"
