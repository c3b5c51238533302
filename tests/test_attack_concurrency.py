"""Two processes on one workspace (issue #17): two resumes of one run, imports during a run, `serve` reading while
`optimize` writes. No corruption (`ledger verify`, the run intact against an uninterrupted one), no crash, and a
clear one-line message for the process that loses.

Quick tier: one round of each. `pytest -m soak`: GYM_TF_SOAK_ROUNDS rounds (default 5).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from conftest import run_cli
from gym_tf.library import EMPTY_LIBRARY, AddOp, apply_ops
from gym_tf.library_io import export_library
from gym_tf.publishing import verify_ledger
from gym_tf.store import RunStore
from server import ServerConfig, create_app
from server.upstream import Upstream
from test_attack_faults import clean, intact, rollout_rows  # noqa: F401 - `clean` is a fixture
from test_server import Running, start_fake

TESTS = Path(__file__).parent
ROUNDS = int(os.environ.get("GYM_TF_SOAK_ROUNDS", "5"))


def start_run(workspace: Path, delay: float, *extra: str) -> tuple[subprocess.Popen, str]:
    """crash_run.py in a child process (the gated config, the scripted fake); returns it and its run id."""
    child = subprocess.Popen([sys.executable, str(TESTS / "crash_run.py"), str(workspace), str(delay), "gated",
                              *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return child, child.stdout.readline().strip()


def wait_rows(store: RunStore, child: subprocess.Popen, rows: int) -> None:
    deadline = time.time() + 120
    while child.poll() is None and time.time() < deadline:
        if store.db["rollouts"].count + store.db["learner_calls"].count >= rows:
            return
        time.sleep(0.01)


# --- two resumes of one run ---------------------------------------------------------------------------------------


def two_resumes(tmp: Path, clean, rounds: int, figures) -> None:
    clean_store, clean_id, total_rows = clean
    tally = Counter()
    for i in range(rounds):
        workspace = tmp / f"resumes-{i}"
        child, run_id = start_run(workspace, 0.003)
        store = RunStore(workspace)
        wait_rows(store, child, total_rows // 3)
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
        before = rollout_rows(store, run_id)
        # both at once; the scripted fake is slowed so that the winner still holds the run when the loser asks
        resumes = [subprocess.Popen([sys.executable, str(TESTS / "crash_run.py"), str(workspace), "0.01", "gated",
                                     "--resume", run_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(2)]
        done = [(p.wait(timeout=300), *p.communicate()) for p in resumes]
        codes = sorted(code for code, _, _ in done)
        assert codes == [0, 1], [(c, err[-500:]) for c, _, err in done]
        loser = next(err for code, _, err in done if code == 1).strip()
        assert loser.startswith(f"error: run {run_id} is running in process") and "\n" not in loser, loser
        faults = intact(RunStore(workspace), run_id, clean_store, clean_id, before)
        assert not +faults, dict(faults)
        tally["rounds"] += 1
    figures("two resumes", f"{tally['rounds']} rounds of two `--resume` of one killed run at once: one finished, "
            "one refused in one line naming the holder; 0 rollouts lost or duplicated, 0 corrupt versions")


def test_two_resumes_of_one_run_one_wins_one_is_told(tmp_path, clean, figures):
    two_resumes(tmp_path, clean, 1, figures)


# --- imports during a run -------------------------------------------------------------------------------------


def imports_during_a_run(tmp: Path, clean, rounds: int, figures) -> None:
    clean_store, clean_id, _ = clean
    files = []
    for n in range(8):
        version, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text=f"Imported lesson number {n} of this test.")], 1)
        export_library(version, tmp / f"lib-{n}.json")
        files.append((tmp / f"lib-{n}.json", version.id))
    imported = 0
    for i in range(rounds):
        workspace = tmp / f"imports-{i}"
        child, run_id = start_run(workspace, 0.02)
        RunStore(workspace)  # the tables exist before the CLI opens the workspace
        # `gym-tf library import` processes, all at once, while the run writes
        importers = [(subprocess.Popen([sys.executable, "-m", "gym_tf", "library", "import", str(path), "--workspace",
                                        str(workspace)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                      version_id) for path, version_id in files]
        for process, version_id in importers:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0 and version_id in out, err[-500:]
            imported += 1
        assert child.poll() is None, "the run ended before the imports: nothing was concurrent"
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-2000:]
        store = RunStore(workspace)
        assert {v for _, v in files} <= {row["id"] for row in store.versions()}
        faults = intact(store, run_id, clean_store, clean_id, {})
        assert not +faults, dict(faults)
    figures("imports during a run", f"{imported} `library import` processes during {rounds} optimize run(s): all "
            "imported, the runs finished intact, ledger verified")


def test_imports_during_a_run_corrupt_nothing(tmp_path, clean, figures):
    imports_during_a_run(tmp_path, clean, 1, figures)


# --- serve reading while optimize writes ----------------------------------------------------------------------------


def serve_during_a_run(tmp: Path, clean, rounds: int, figures) -> None:
    clean_store, clean_id, _ = clean
    upstream, url, _ = start_fake(tmp, supports_n=True)
    outcomes = Counter()
    try:
        for i in range(rounds):
            workspace = tmp / f"serve-{i}"
            child, run_id = start_run(workspace, 0.003)
            store = RunStore(workspace)
            proxy = Running(create_app(Upstream(url), store, ServerConfig()))
            try:
                with httpx.Client(base_url=proxy.url, timeout=10) as client:
                    while child.poll() is None:
                        # promote what the run just wrote (a third writer), then ask through the server
                        promoted = [v["id"] for v in store.versions(run_id) if v["status"] == "promoted"]
                        if promoted and outcomes["requests"] % 10 == 0:
                            store.promote(promoted[-1])
                        reply = client.post("/chat/completions", json={
                            "messages": [{"role": "user", "content": "What is 2+2?"}], "stream": bool(outcomes["requests"] % 2)})
                        outcomes["requests"] += 1
                        outcomes[f"{reply.status_code // 100}xx"] += 1
                        assert reply.status_code == 200, reply.text[:300]
                        version = reply.headers["x-gym-tf-library-version"]
                        assert version == EMPTY_LIBRARY.id or store.version(version).id == version
                        outcomes["versions seen"] += version not in outcomes
                        outcomes[version] = 1
            finally:
                proxy.stop()
            _, err = child.communicate(timeout=300)
            assert child.returncode == 0, err[-2000:]
            faults = intact(RunStore(workspace), run_id, clean_store, clean_id, {})
            assert not +faults, dict(faults)
    finally:
        upstream.kill()
    figures("serve during a run", f"{outcomes['requests']:,} requests to `serve` while {rounds} optimize run(s) wrote "
            f"and versions were promoted: {outcomes['5xx']} 5xx, {outcomes['versions seen']} library versions "
            "answered, runs intact, ledger verified")
    assert outcomes["requests"] >= 20 and outcomes["versions seen"] >= 2


def test_serve_reads_while_optimize_writes(tmp_path, clean, figures):
    serve_during_a_run(tmp_path, clean, 1, figures)


@pytest.mark.soak
def test_two_processes_on_one_workspace_soak(tmp_path, clean, figures):
    two_resumes(tmp_path, clean, ROUNDS, figures)
    imports_during_a_run(tmp_path, clean, ROUNDS, figures)
    serve_during_a_run(tmp_path, clean, ROUNDS, figures)


def test_a_reader_is_not_held_up_by_another_process_write(tmp_path):
    """`ledger verify` from a second process while another holds the write lock: it opened the workspace with a
    write of its own, waited out the busy timeout and died with sqlite3's "database is locked", before."""
    store = RunStore(tmp_path / "ws")
    v1, _ = apply_ops(EMPTY_LIBRARY, [AddOp(op="add", text="Check units before answering.")], step=1)
    store.db.conn.execute("BEGIN IMMEDIATE")  # another process is in the middle of a write transaction
    try:
        done = run_cli("ledger", "verify", "--workspace", str(tmp_path / "ws"))
    finally:
        store.db.conn.execute("ROLLBACK")
    assert done.returncode == 0 and done.stdout.startswith("ledger ok"), done.stderr
    store.put_version(v1, run_id="", status="imported")
    verify_ledger(store)
