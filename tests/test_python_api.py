"""The Python API: the README's example runs as written, and `library.messages()` is what the proxy sends upstream."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gym_tf
from gym_tf.store import RunStore
from test_server import fake, library_store, received  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- api-example -->\n```python\n(.*?)```", text, re.S)
    assert match, "README.md lost its api-example block"
    return match.group(1)


def test_public_names_resolve_and_unknown_ones_fail():
    for name in gym_tf.__all__:
        assert getattr(gym_tf, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_thing"):
        gym_tf.no_such_thing  # noqa: B018


def test_library_messages_are_what_the_proxy_sends_upstream(fake):  # noqa: F811
    client, record, store, v1, v2, *_ = fake
    for messages in ([{"role": "user", "content": "How do units work?"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "arithmetic please"}]):
        client.chat.completions.create(model="anything", messages=messages)
        assert received(record)[-1]["messages"] == v1.messages(messages)
    assert v1.messages([{"role": "user", "content": "x"}])[0]["content"].startswith(v1.render("x"))


@pytest.mark.timeout(900)
def test_readme_example_runs_on_the_embedded_model_into_a_cli_workspace(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=850,
                            env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    run_line = re.search(r"run (\S+): (\w+), (\d+) items, version (\S+)", result.stdout)
    assert run_line and run_line.group(2) == "finished", result.stdout
    assert re.search(r"^none \d", result.stdout, re.M) and re.search(r"^learned \d", result.stdout, re.M)
    assert re.search(r"^manifest \w{40,}", result.stdout, re.M), result.stdout
    # the run is in the workspace the CLI reads, like any CLI run
    store = RunStore(tmp_path / "api-workspace")
    assert [r["id"] for r in store.runs()] == [run_line.group(1)]
    cli = subprocess.run([sys.executable, "-m", "gym_tf", "runs", "--workspace", str(tmp_path / "api-workspace")],
                         capture_output=True, text=True, timeout=120, env=env)
    assert cli.returncode == 0 and run_line.group(1)[:8] in cli.stdout, cli.stdout + cli.stderr
    learned = store.version(run_line.group(4))
    assert learned.id == run_line.group(4) and len(learned.items) == int(run_line.group(3))
