"""Faults injected into `optimize` and `serve` (issue #17): SIGKILL at random points, an upstream that dies or answers
garbage, a workspace that fills up or turns read-only in the middle of a step. After each fault the run is resumed;
then, against an uninterrupted run of the same config: 0 rollouts lost, 0 duplicated, 0 sampled again, every version
intact (`ledger verify`, the item rules) and the same final library.

Disk faults come two ways: SQLite's own limits (`max_page_count`, `query_only`) at any call, and the kernel's, on a
tmpfs mounted for the test (filled to its last byte: ENOSPC; mounted read-only between runs: EROFS), skipped where
no tmpfs can be mounted.

Quick tier: 3 kill points, 2 disk faults of each kind, 2 real full disks. `pytest -m soak`: GYM_TF_SOAK_KILLS kill
points (default 25) and GYM_TF_SOAK_DISK_FAULTS of each kind, real full disks included (default 10).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from conftest import run_cli
from crash_run import GATED, scripted
from garbage_upstream import MODES, GarbageUpstream
from gym_tf.backends.openai_http import OpenAIBackend
from gym_tf.errors import BackendError, StoreError
from gym_tf.library_io import check_library
from gym_tf.optimize import Optimizer, resume_config
from gym_tf.publishing import verify_ledger
from gym_tf.store import RunStore
from server import ServerConfig, create_app
from server.upstream import Upstream
from test_server import Running

TESTS = Path(__file__).parent
KILLS = int(os.environ.get("GYM_TF_SOAK_KILLS", "25"))
DISK_FAULTS = int(os.environ.get("GYM_TF_SOAK_DISK_FAULTS", "10"))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The uninterrupted run every faulted one is compared with (gated: promoted and rejected versions)."""
    store = RunStore(tmp_path_factory.mktemp("clean") / "ws")
    optimizer = Optimizer(GATED, store, scripted(gated=True))
    asyncio.run(optimizer.run())
    rows = store.db["rollouts"].count + store.db["learner_calls"].count
    return store, optimizer.run_id, rows


def rollout_rows(store: RunStore, run_id: str) -> dict[tuple[str, str], tuple]:
    """Each rollout by its key without the run id, and its prompt: a validation key also names its library version,
    whose id differs between runs (provenance names the run's rollouts) while its prompt does not."""
    return {(r["key"].split("/", 1)[1].split("@")[0], r["messages"]): (r["completion"], r["reward"])
            for r in store.db["rollouts"].rows_where("run_id = ?", [run_id])}


def intact(store: RunStore, run_id: str, clean_store: RunStore, clean_id: str, before: dict[str, tuple]) -> Counter:
    """Compare a resumed run with the clean one; returns what was lost, duplicated, resampled or corrupt (all 0)."""
    got, want = rollout_rows(store, run_id), rollout_rows(clean_store, clean_id)
    keys = [r["key"] for r in store.db["rollouts"].rows_where("run_id = ?", [run_id])]
    faults = Counter(lost=len(set(want) - set(got)), extra=len(set(got) - set(want)),
                     duplicated=len(keys) - len(set(keys)),
                     resampled=sum(1 for k, v in before.items() if got.get(k) != v),
                     differs=sum(1 for k in want if k in got and got[k] != want[k]))
    try:
        verify_ledger(store)
        for row in store.versions(run_id):
            check_library(store.version(row["id"]))
    except Exception as exc:  # noqa: BLE001 - any failure here is a corrupt version, counted and then reported
        faults["corrupt versions"] += 1
        print(f"corrupt: {exc}")
    # version ids differ between runs (provenance names the run's rollouts): compare what the library says
    faults["other final library"] = int(final_library(store, run_id) != final_library(clean_store, clean_id))
    faults["other steps"] = int(verdicts(store, run_id) != verdicts(clean_store, clean_id))
    return faults


def final_library(store: RunStore, run_id: str) -> list[tuple]:
    library = store.version(store.run(run_id)["current_version"])
    return [(i.id, i.kind, i.text, i.provenance.problem_ids) for i in library.items]


def verdicts(store: RunStore, run_id: str) -> list[tuple]:
    return [(s["step"], s["status"], s["stats"].get("val_mean")) for s in store.steps(run_id)]


def resume(store: RunStore, run_id: str):
    run_id, config = resume_config(store, run_id)
    return asyncio.run(Optimizer(config, store, scripted(gated=True), run_id=run_id).run())


# --- SIGKILL at random points -------------------------------------------------------------------------------------


def kill_at_random_points(tmp: Path, clean, count: int, figures) -> None:
    clean_store, clean_id, total_rows = clean
    rng = random.Random(17 + count)
    totals, points = Counter(), []
    for i in range(count):
        # a random moment: after a random number of stored rows, plus a random part of one row's time
        threshold, jitter = rng.randint(0, total_rows - 1), rng.uniform(0, 0.01)
        workspace = tmp / f"kill-{i}"
        child = subprocess.Popen([sys.executable, str(TESTS / "crash_run.py"), str(workspace), "0.003", "gated"],
                                 stdout=subprocess.PIPE, text=True)
        run_id = child.stdout.readline().strip()
        store = RunStore(workspace)
        deadline = time.time() + 120
        while child.poll() is None and time.time() < deadline:
            if store.db["rollouts"].count + store.db["learner_calls"].count >= threshold:
                break
            time.sleep(0.002)
        time.sleep(jitter)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        before = rollout_rows(store, run_id)
        points.append(len(before) + store.db["learner_calls"].count)
        assert resume(store, run_id).status == "finished"
        faults = intact(store, run_id, clean_store, clean_id, before)
        totals += faults
        assert not +faults, (i, threshold, dict(faults))
    figures("SIGKILL", f"{count} random kill points (after {min(points)} to {max(points)} of {total_rows} stored rows), "
            f"each resumed: {totals['lost']} rollouts lost, {totals['duplicated']} duplicated, "
            f"{totals['resampled']} sampled again, {totals['corrupt versions']} corrupt versions")


def test_sigkill_at_random_points_then_resume_loses_nothing(tmp_path, clean, figures):
    kill_at_random_points(tmp_path, clean, 3, figures)


@pytest.mark.soak
def test_sigkill_at_random_points_soak(tmp_path, clean, figures):
    kill_at_random_points(tmp_path, clean, KILLS, figures)


# --- a workspace that fills up or turns read-only during a step ------------------------------------------------------


class FaultAfter:
    """Passes calls to the scripted fake; at call `after` the store's connection stops taking writes, the way SQLite
    sees a full disk (`max_page_count` reached: SQLITE_FULL) or a read-only file (SQLITE_READONLY)."""

    def __init__(self, inner, store: RunStore, after: int, fault: str):
        self.inner, self.store, self.after, self.fault, self.calls = inner, store, after, fault, 0
        self.model = inner.model

    def describe(self) -> str:
        return "faulty"

    async def generate(self, messages, n=1, **sampling):
        self.calls += 1
        if self.calls == self.after:
            if self.fault == "disk full":
                pages = self.store.db.execute("PRAGMA page_count").fetchone()[0]
                self.store.db.execute(f"PRAGMA max_page_count={pages}")
            else:
                self.store.db.execute("PRAGMA query_only=1")
        return await self.inner.generate(messages, n, **sampling)

    def heal(self) -> None:
        """Space freed, writable again."""
        self.store.db.execute("PRAGMA max_page_count=4294967294")
        self.store.db.execute("PRAGMA query_only=0")

    async def aclose(self) -> None:
        pass


def fault_then_resume(store: RunStore, backend: "FaultAfter", clean) -> Counter:
    """Run until the fault's named StoreError, heal it, and resume in the same process (a new one is the SIGKILL
    case above): what the resumed run lost or broke against the clean one (all 0)."""
    optimizer = Optimizer(GATED, store, backend)
    with pytest.raises(StoreError, match=f"cannot write to the workspace {re.escape(str(store.root))}"):
        asyncio.run(optimizer.run())
    backend.heal()
    before = rollout_rows(store, optimizer.run_id)
    assert resume(store, optimizer.run_id).status == "finished"
    clean_store, clean_id, _ = clean
    return intact(store, optimizer.run_id, clean_store, clean_id, before)


def disk_faults(tmp: Path, clean, count: int, figures) -> None:
    clean_store, clean_id, _ = clean
    calls = len(scripted_calls(clean_store, clean_id))
    rng = random.Random(5 + count)
    totals = Counter()
    for fault in ("disk full", "read-only"):
        for i in range(count):
            workspace = tmp / f"{fault.replace(' ', '-')}-{i}"
            store = RunStore(workspace)
            faults = fault_then_resume(store, FaultAfter(scripted(gated=True), store, rng.randint(1, calls), fault), clean)
            totals[fault] += 1
            totals += faults
            assert not +Counter({k: v for k, v in faults.items()}), (fault, i, dict(faults))
    figures("disk faults", f"{totals['disk full']} disk-full and {totals['read-only']} read-only faults at random "
            f"calls of a run, each a named StoreError, each resumed: {totals['lost']} rollouts lost, "
            f"{totals['duplicated']} duplicated, {totals['corrupt versions']} corrupt versions")


class FillDiskAfter(FaultAfter):
    """The same moment, but the kernel's fault: at call `after` the workspace's own filesystem (a tmpfs mounted for
    the test) is filled to its last byte, and every write gets ENOSPC. `heal` frees the space again. (A filesystem
    cannot be remounted read-only under a file open for writing, so a read-only fault mid-step stays simulated
    above; `test_a_workspace_on_a_read_only_filesystem...` is the real one, between runs.)"""

    def __init__(self, inner, store: RunStore, after: int, mount: Path):
        super().__init__(inner, store, after, "disk full")
        self.filler = mount / "filler"

    async def generate(self, messages, n=1, **sampling):
        self.calls += 1
        if self.calls == self.after:
            with open(self.filler, "wb", buffering=0) as filler, contextlib.suppress(OSError):  # unbuffered:
                while True:  # nothing is left to flush, and fail, at close
                    filler.write(b"\0" * 65536)
        return await self.inner.generate(messages, n, **sampling)

    def heal(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MiB tmpfs of the test's own (root with mount rights, as here and in CI); skipped where none can be made."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def real_disk_full(mount: Path, clean, count: int, figures) -> None:
    clean_store, clean_id, _ = clean
    calls = len(scripted_calls(clean_store, clean_id))
    rng = random.Random(29 + count)
    totals = Counter()
    for i in range(count):
        workspace = mount / f"full-{i}"
        store = RunStore(workspace)
        faults = fault_then_resume(store, FillDiskAfter(scripted(gated=True), store, rng.randint(1, calls), mount), clean)
        totals += faults
        assert not +faults, (i, dict(faults))
        store.close()
    figures("real disk full", f"{count} full tmpfs (ENOSPC) at random calls of a run, each a named StoreError, each "
            f"resumed: {totals['lost']} rollouts lost, {totals['duplicated']} duplicated, "
            f"{totals['corrupt versions']} corrupt versions")


def test_a_real_filesystem_that_fills_up_during_a_step(small_disk, clean, figures):
    real_disk_full(small_disk, clean, 2, figures)


@pytest.mark.soak
def test_real_disk_full_soak(small_disk, clean, figures):
    real_disk_full(small_disk, clean, DISK_FAULTS, figures)


def test_a_workspace_on_a_read_only_filesystem_is_a_named_error_and_resumes_once_writable(small_disk, clean):
    """A run stopped part-way, its filesystem then mounted read-only (EROFS): resuming it is a StoreError naming
    the workspace (in the CLI, one line), and once writable it resumes to the clean run's result."""
    clean_store, clean_id, _ = clean
    workspace = small_disk / "ws"
    child = subprocess.Popen([sys.executable, str(TESTS / "crash_run.py"), str(workspace), "0.003", "gated"],
                             stdout=subprocess.PIPE, text=True)
    run_id = child.stdout.readline().strip()
    store = RunStore(workspace)
    while child.poll() is None and store.db["rollouts"].count < 8:
        time.sleep(0.002)
    os.kill(child.pid, signal.SIGKILL)  # (a process of its own: nothing may hold a file open for the remount)
    child.wait()
    child.stdout.close()
    store.close()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        with pytest.raises(StoreError, match=f"workspace {re.escape(str(workspace))}"):
            resume(RunStore(workspace), run_id)
        listed = run_cli("runs", "--workspace", str(workspace))
        assert listed.returncode == 1 and listed.stderr.startswith(f"error: cannot open the workspace {workspace}")
        assert len(listed.stderr.strip().splitlines()) == 1
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    store = RunStore(workspace)
    before = rollout_rows(store, run_id)
    assert resume(store, run_id).status == "finished"
    assert not +intact(store, run_id, clean_store, clean_id, before)
    store.close()


def scripted_calls(store: RunStore, run_id: str) -> list:
    """How many backend calls a clean run makes: one per group of rollouts and one per learner reply."""
    groups = {r["key"].rsplit("/", 1)[0] for r in store.db["rollouts"].rows_where("run_id = ?", [run_id])}
    return [*groups, *store.db["learner_calls"].rows_where("run_id = ?", [run_id])]


def test_disk_full_or_read_only_during_a_step_is_named_and_resumable(tmp_path, clean, figures):
    disk_faults(tmp_path, clean, 2, figures)


@pytest.mark.soak
def test_disk_faults_soak(tmp_path, clean, figures):
    disk_faults(tmp_path, clean, DISK_FAULTS, figures)


def test_a_store_write_on_a_read_only_workspace_names_it(tmp_path):
    """sqlite3's OperationalError escaped from every write before: now one StoreError naming the workspace."""
    store = RunStore(tmp_path / "ws")
    store.db.execute("PRAGMA query_only=1")
    with pytest.raises(StoreError, match="cannot write to the workspace .*readonly"):
        store.new_run("optimize", {}, "m", "d", "empty")


# --- an upstream that answers garbage, or dies --------------------------------------------------------------------


def test_garbage_from_the_upstream_is_a_named_error_in_optimize_and_a_502_in_serve(tmp_path, figures):
    outcomes = Counter()
    with GarbageUpstream() as upstream:
        proxy = Running(create_app(Upstream(upstream.url, supports_n=True), RunStore(tmp_path / "serve"),
                                   ServerConfig()))
        try:
            for mode in MODES:
                upstream.mode = mode
                # optimize: the backend's error names the server; the run is recorded as failed, not left running
                store = RunStore(tmp_path / mode)
                backend = OpenAIBackend(upstream.url, model="m", max_retries=0, timeout_s=5)
                optimizer = Optimizer(GATED, store, backend)
                with pytest.raises(BackendError, match=r"127\.0\.0\.1"):
                    asyncio.run(optimizer.run())
                assert store.run(optimizer.run_id)["status"] == "failed"
                outcomes["optimize named"] += 1
                # serve: an OpenAI-shaped error, never a 500; a stream ends
                for stream in (False, True):
                    reply = httpx.post(f"{proxy.url}/chat/completions", timeout=10,
                                       json={"messages": [{"role": "user", "content": "hi"}], "stream": stream})
                    assert reply.status_code != 500, (mode, stream, reply.text[:200])
                    if reply.status_code >= 400:
                        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
                    elif stream:
                        last = reply.content.rstrip().rsplit(b"\n\n", 1)[-1]
                        assert last == b"data: [DONE]" or b'"error"' in last, (mode, reply.content[-200:])
                    outcomes[f"serve {reply.status_code}"] += 1
        finally:
            proxy.stop()
    figures("garbage upstream", f"{len(MODES)} kinds of garbage: optimize {outcomes['optimize named']} named errors; "
            f"serve {', '.join(f'{k[6:]}: {v}' for k, v in sorted(outcomes.items()) if k.startswith('serve'))}, 0 500s")


def test_an_upstream_killed_during_optimize_then_back_loses_no_rollout(tmp_path, clean, figures):
    """The model server dies in the middle of a run: a named error, and a resume against it once it is back
    finishes with every rollout stored once (the fake answers every prompt the same way, so rewards are all 0)."""
    from conftest import free_port
    from test_server import start_fake

    port = free_port()
    process, url, _ = start_fake(tmp_path, supports_n=True, delay=0.02, port=port)
    store = RunStore(tmp_path / "ws")
    config = GATED.model_copy(update={"val_dataset": None})
    backend = OpenAIBackend(url, model="fake-model", max_retries=0, timeout_s=10)
    optimizer = Optimizer(config, store, backend)

    async def run_and_kill():
        task = asyncio.create_task(optimizer.run())
        while store.db["rollouts"].count < 10:
            await asyncio.sleep(0.01)
        process.kill()
        return await task

    with pytest.raises(BackendError, match="cannot reach"):
        asyncio.run(run_and_kill())
    process.wait()
    before = rollout_rows(store, optimizer.run_id)
    process, url, _ = start_fake(tmp_path, supports_n=True, port=port)
    try:
        run_id, config = resume_config(store, optimizer.run_id)
        backend = OpenAIBackend(url, model="fake-model", max_retries=0, timeout_s=10)
        result = asyncio.run(Optimizer(config, store, backend, run_id=run_id).run())
    finally:
        process.kill()
    after = rollout_rows(store, run_id)
    keys = [r["key"] for r in store.db["rollouts"].rows]
    assert result.status == "finished" and len(keys) == len(set(keys)) == 12 * 4 * 2
    assert all(after[k] == v for k, v in before.items())
    figures("upstream killed", f"during optimize after {len(before)} rollouts: a named error; resumed: "
            f"{len(keys)} of {12 * 4 * 2} rollouts, 0 lost, 0 duplicated, 0 sampled again")

