"""The embedded engine's build and the embedded model's supply chain, checked before any decode can run."""

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import xllamacpp

from gym_tf.backends import core_claims, embedded
from gym_tf.errors import BackendRequestFailed, ModelNotFound


def test_the_installed_engine_has_no_crashing_cpu_path():
    """Fails on a machine whose llama.cpp build enables AMX (the path that segfaults on Sapphire Rapids), before any
    model is loaded; and the build must still be a vectorized one."""
    features = embedded.engine_features()
    assert features.get("AVX2") == "1", features
    assert not [f for f, on in features.items() if f.startswith("AMX") and on == "1"], features
    assert embedded.check_engine() == features


def test_a_build_reporting_amx_is_refused(monkeypatch):
    monkeypatch.setattr(xllamacpp, "get_system_info",
                        lambda: "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | ")
    with pytest.raises(BackendRequestFailed, match="AMX_INT8"):
        embedded.check_engine()
    with pytest.raises(BackendRequestFailed, match="AMX_INT8"):
        embedded.EmbeddedBackend()  # refused before the model is even looked up


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GYM_TF_CACHE", str(tmp_path))
    return tmp_path


def test_the_model_parts_are_read_as_data_never_imported(cache):
    code = ("import sys; from gym_tf.backends.embedded import default_model_path; p = default_model_path(); "
            "print(p, [m for m in sys.modules if m.startswith('pandas_sns')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "GYM_TF_CACHE": str(cache)}).stdout.split()
    assert out[1:] == ["[]"]
    with open(out[0], "rb") as f:
        assert hashlib.file_digest(f, "sha256").hexdigest() == embedded.DEFAULT_MODEL_SHA256


def test_a_cached_model_changed_on_disk_is_hashed_again_and_replaced(cache):
    path = embedded.default_model_path()
    record = json.loads(path.with_suffix(".verified.json").read_text())
    assert record["sha256"] == embedded.DEFAULT_MODEL_SHA256 and record["size"] == path.stat().st_size
    with path.open("r+b") as f:  # same size, one byte different: only the mtime tells
        f.seek(1_000_000)
        byte = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    stamp = path.stat().st_mtime_ns
    os.utime(path, ns=(stamp, record["mtime_ns"] + 1_000_000))  # a coarse clock must not hide the write
    assert embedded.default_model_path() == path
    with path.open("rb") as f:
        assert hashlib.file_digest(f, "sha256").hexdigest() == embedded.DEFAULT_MODEL_SHA256


def test_parts_that_join_to_the_wrong_hash_are_refused(cache, monkeypatch, tmp_path):
    fake = tmp_path / "part.bin"
    fake.write_bytes(b"not a model")
    monkeypatch.setattr(embedded, "_part_files", lambda: [fake])
    with pytest.raises(ModelNotFound, match="refusing to load it"):
        embedded.default_model_path()
    assert not list(cache.glob("*.gguf")) and not list(cache.glob("*.partial-*"))


def _holding(slots: embedded.Slots, size: int, got: threading.Event, release: threading.Event) -> threading.Thread:
    def hold():
        with slots.hold(size):
            got.set()
            release.wait(5)
    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread


def test_requests_smaller_than_the_engine_share_its_slots_and_a_full_group_keeps_its_place_in_line():
    slots = embedded.Slots(4)
    got = [threading.Event() for _ in range(4)]
    release = [threading.Event() for _ in range(4)]
    first = _holding(slots, 3, got[0], release[0])
    assert got[0].wait(5)
    group = _holding(slots, 4, got[1], release[1])  # waits: only one slot is free
    deadline = time.monotonic() + 5
    while len(slots._line) != 1 and time.monotonic() < deadline:  # in line before the next one comes
        time.sleep(0.01)
    assert len(slots._line) == 1 and not got[1].wait(0.2)
    pair = _holding(slots, 1, got[2], release[2])  # fits in the free slot, but the group came first
    assert not got[2].wait(0.2) and slots.free == 1
    release[0].set()
    assert got[1].wait(5) and not got[2].wait(0.2) and slots.free == 0
    release[1].set()
    assert got[2].wait(5)
    second = _holding(slots, 2, got[3], release[3])  # two small requests at once
    assert got[3].wait(5) and slots.free == 1
    for event in release:
        event.set()
    for thread in (first, group, pair, second):
        thread.join(5)
    assert slots.free == 4


@pytest.mark.parametrize("size", [0, 5])
def test_a_request_the_engine_has_no_slots_for_is_refused(size):
    with pytest.raises(ValueError, match="slots"):
        with embedded.Slots(4).hold(size):
            pass


def _claim_of(pid: int, cache, threads: int, host: str | None = None):
    host = host or socket.gethostname()
    (cache / "engines").mkdir(exist_ok=True)
    (cache / "engines" / f"{pid}-{os.urandom(4).hex()}@{host}.engine").write_text(f"{threads}\n")


def test_an_engine_starting_beside_another_process_s_engine_warns_and_leaves_its_own_claim(tmp_path, caplog):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    cores = os.cpu_count()
    try:
        _claim_of(other.pid, tmp_path, threads=cores)
        _claim_of(other.pid, tmp_path, threads=1)  # that process runs two engines
        _claim_of(other.pid + 1, tmp_path, threads=cores, host="another-host")  # a shared cache: not this machine
        with caplog.at_level("WARNING", logger="gym_tf.backends.core_claims"):
            claim = core_claims.CoreClaim(tmp_path, threads=cores)
        assert f"(pid {other.pid})" in caplog.text and f"claim {2 * cores + 1} threads on {cores} cores" in caplog.text
        assert claim.path.read_text() == f"{cores}\n" and claim.path.name.startswith(f"{os.getpid()}-")
        # our own claim is not another process's; the other process's two engines are counted together
        assert core_claims.engines_elsewhere(tmp_path) == {other.pid: cores + 1}
        assert [p.name for p in (tmp_path / "engines").iterdir() if p.name.endswith("@another-host.engine")]
        claim.release()
        assert not claim.path.exists()
    finally:
        other.kill()
        other.wait()


def test_engines_that_fit_the_cores_together_do_not_warn(tmp_path, caplog):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _claim_of(other.pid, tmp_path, threads=1)
        with caplog.at_level("WARNING", logger="gym_tf.backends.core_claims"):
            claim = core_claims.CoreClaim(tmp_path, threads=max(1, os.cpu_count() - 1))
        assert caplog.text == "" and core_claims.engines_elsewhere(tmp_path) == {other.pid: 1}
        claim.release()
    finally:
        other.kill()
        other.wait()


def test_the_claim_of_a_process_that_has_gone_is_removed_and_warns_nobody(tmp_path, caplog):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _claim_of(gone.pid, tmp_path, threads=os.cpu_count())
    with caplog.at_level("WARNING", logger="gym_tf.backends.core_claims"):
        claim = core_claims.CoreClaim(tmp_path, threads=os.cpu_count())
    assert caplog.text == ""
    assert list((tmp_path / "engines").iterdir()) == [claim.path]
    claim.release()


def test_a_cache_the_engine_cannot_write_to_costs_only_the_claim(tmp_path):
    (tmp_path / "engines").write_text("a file where the claims' folder should be")
    claim = core_claims.CoreClaim(tmp_path, threads=2)  # no error: the engine would still start
    assert not claim.path.exists()
    claim.release()
