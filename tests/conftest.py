"""Shared fixtures. Fakes sit at the LLM-client seam; real servers start once per session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fakes import ScriptedBackend  # noqa: E402
from gym_tf.datasets import load_dataset  # noqa: E402
from gym_tf.store import RunStore  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, process: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout} s")


@pytest.fixture
def quickstart():
    return load_dataset("quickstart")


@pytest.fixture
def scripted(quickstart):
    return ScriptedBackend({p.problem: p.answer for p in quickstart})


@pytest.fixture
def store(tmp_path):
    return RunStore(tmp_path / "ws")


@pytest.fixture(scope="session")
def embedded_model_path() -> Path:
    from gym_tf.backends.embedded import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def llama_server(embedded_model_path, tmp_path_factory):
    """llama.cpp's OpenAI-compatible server on loopback (a child process), serving the embedded GGUF. It refuses n > 1."""
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "log.txt"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).parent / "llama_server.py"), str(embedded_model_path), str(port),
             "qwen-0.5b"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        wait_for(f"http://127.0.0.1:{port}/v1/models", process)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(timeout=30)


def run_cli(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gym_tf", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "COLUMNS": "250", **(env or {})},
    )


# --- the attack suite's figures ---------------------------------------------------------------------------------
# Each attack test records one line ("schemathesis: 1,200 requests, 0 5xx, 0 hangs"); they are printed at the end of
# the run whatever the capture mode, so CI's log and `pytest -m soak` both show them. GYM_TF_FIGURES=FILE also
# appends them there, as JSON lines, for the README.

FIGURES: list[str] = []


@pytest.fixture
def figures():
    """Call `figures(name, text)` to report a measured figure of the attack suite."""
    def record(name: str, text: str) -> None:
        FIGURES.append(f"{name}: {text}")
        if os.environ.get("GYM_TF_FIGURES"):
            import json

            with open(os.environ["GYM_TF_FIGURES"], "a") as out:
                out.write(json.dumps({"name": name, "figure": text, "time": time.time()}) + "\n")
    return record


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("attack suite figures")
        for line in FIGURES:
            terminalreporter.write_line(line)

