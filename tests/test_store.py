"""The run store shared by processes: run locks with a heartbeat, idempotent version inserts, dataset checks on resume.
Real SQLite, real processes (kill -9 included)."""

import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from gym_tf.datasets import load_dataset
from gym_tf.errors import ConfigError, StoreError
from gym_tf.library import LibraryVersion
from gym_tf.store import STALE_BEATS, RunStore

BEAT = 0.2  # seconds between heartbeats in these tests, so a crash shows within about a second

HOLD_A_RUN = """
import sys, time
from gym_tf.store import RunStore
store = RunStore(sys.argv[1], heartbeat_s=float(sys.argv[2]))
print(store.new_run("optimize", {}, "m", "d.jsonl", "empty"), flush=True)
time.sleep(120)
"""

IMPORT_VERSIONS = """
import sys, time
from gym_tf.library import LibraryVersion
from gym_tf.store import RunStore
while time.time() < float(sys.argv[2]):  # start together, to race
    time.sleep(0.001)
store = RunStore(sys.argv[1])
for step in range(1, 31):
    store.put_version(LibraryVersion(step=step), run_id="", status="imported")
"""


def test_a_live_run_cannot_be_taken_and_a_killed_one_shows_as_crashed(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_A_RUN, str(tmp_path), str(BEAT)], stdout=subprocess.PIPE,
                              text=True)
    try:
        run_id = holder.stdout.readline().strip()
        store = RunStore(tmp_path, heartbeat_s=BEAT)
        time.sleep(BEAT * STALE_BEATS * 2)  # alive: its heartbeat keeps it running past the stale limit
        assert store.run(run_id)["status"] == "running"
        with pytest.raises(StoreError, match=f"run {run_id} is running in process {holder.pid}@"):
            store.claim_run(run_id)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert store.run(run_id)["status"] == "crashed"  # its process is gone: no need to wait for the heartbeat
    assert [r["status"] for r in store.runs()] == ["crashed"]
    store.claim_run(run_id)  # a resume takes a crashed run over
    assert store.run(run_id)["status"] == "running"
    time.sleep(BEAT * STALE_BEATS * 2)  # this process's heartbeat keeps it fresh
    assert store.run(run_id)["status"] == "running"
    store.finish_run(run_id, "finished", {})
    assert store.run(run_id)["status"] == "finished"


def test_a_run_held_on_another_machine_shows_as_crashed_once_its_heartbeat_stops(tmp_path):
    store = RunStore(tmp_path, heartbeat_s=BEAT)
    run_id = store.new_run("optimize", {}, "m", "d.jsonl", "empty")
    # now held by a process on another machine, which beat just now (this store's heartbeat no longer matches)
    store.db["runs"].update(run_id, {"owner": "4242@another-machine/0123abcd", "heartbeat": time.time()})
    with pytest.raises(StoreError, match="is running in process 4242@another-machine"):
        store.claim_run(run_id)
    time.sleep(BEAT * (STALE_BEATS + 2))
    assert store.run(run_id)["status"] == "crashed"
    store.claim_run(run_id)


def test_the_same_store_may_claim_its_own_run_again(tmp_path):
    store = RunStore(tmp_path, heartbeat_s=BEAT)
    run_id = store.new_run("train", {}, "m", "d.jsonl", "")
    store.claim_run(run_id)
    other = RunStore(tmp_path, heartbeat_s=BEAT)
    with pytest.raises(StoreError, match="is running in process"):
        other.claim_run(run_id)
    store.finish_run(run_id, "failed", {})
    other.claim_run(run_id)  # finished runs are free
    other.finish_run(run_id, "finished", {})


def test_processes_importing_the_same_versions_at_once_neither_crash_nor_duplicate(tmp_path):
    start = time.time() + 3
    workers = [subprocess.Popen([sys.executable, "-c", IMPORT_VERSIONS, str(tmp_path), str(start)],
                                stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errors = [w.communicate(timeout=120)[1] for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], "\n".join(errors)[-3000:]
    store = RunStore(tmp_path)
    rows = store.db.execute("select id, leaf_index from versions").fetchall()
    assert len(rows) == 31  # the empty library and 30 imports, each once
    assert {LibraryVersion(step=s).id for s in range(1, 31)} <= {r[0] for r in rows}
    leaves = store.db.execute("select count(*) from leaf").fetchone()[0]
    assert leaves == 31 and sorted(r[1] for r in rows) == list(range(1, 32))  # one log entry per version
    store.ledger.audit()


# --- the dataset a run was started on ---------------------------------------------------------------------------------


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_dataset(path)


ROWS = [{"problem": f"{i} + {i}?", "answer": str(2 * i)} for i in range(6)]


def test_resume_refuses_a_dataset_whose_rows_shifted(tmp_path):
    store = RunStore(tmp_path / "ws")
    run_id = store.new_run("optimize", {}, "m", "d.jsonl", "empty")
    store.check_dataset(run_id, write(tmp_path / "d.jsonl", ROWS))  # recorded at the start
    store.check_dataset(run_id, load_dataset(tmp_path / "d.jsonl"))  # the same content: fine
    shifted = write(tmp_path / "d.jsonl", ROWS[:2] + ROWS[3:])  # row 2 deleted: ids 2..4 now name other problems
    with pytest.raises(ConfigError, match=r"train dataset of run .* changed .*: 3 problems changed \(2, 3, 4\); "
                                          r"1 missing \(5\)"):
        store.check_dataset(run_id, shifted)
    store.check_dataset(run_id, write(tmp_path / "d.jsonl", ROWS))  # restored: fine again


def test_dataset_checks_are_per_split_and_name_added_and_reordered_problems(tmp_path):
    store = RunStore(tmp_path / "ws")
    run_id = store.new_run("optimize", {}, "m", "d.jsonl", "empty")
    train = write(tmp_path / "t.jsonl", [{**r, "id": f"t{i}"} for i, r in enumerate(ROWS)])
    val = write(tmp_path / "v.jsonl", [{**r, "id": f"v{i}"} for i, r in enumerate(ROWS[:3])])
    store.check_dataset(run_id, train)
    store.check_dataset(run_id, val, split="val")
    with pytest.raises(ConfigError, match=r"val dataset .*: 1 added \(t3\)"):
        store.check_dataset(run_id, val + [train[3]], split="val")
    with pytest.raises(ConfigError, match=r"train dataset .*: the problems are in another order"):
        store.check_dataset(run_id, train[::-1])


def test_a_workspace_from_before_run_locks_opens_and_its_running_run_shows_as_crashed(tmp_path):
    con = sqlite3.connect(tmp_path / "gym-tf.db")
    con.execute("create table runs (id text primary key, kind text, status text, created float, updated float, "
                "config text, config_hash text, model text, dataset text, current_version text, summary text)")
    con.execute("insert into runs values ('old-run', 'optimize', 'running', 1, 1, '{}', '', 'm', 'd', '', '{}')")
    con.commit()
    con.close()
    store = RunStore(tmp_path)
    assert store.run("old-run")["status"] == "crashed"  # no heartbeat was ever recorded: nothing keeps it alive
    store.claim_run("old-run")
    assert store.run("old-run")["status"] == "running"
