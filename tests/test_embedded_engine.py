"""The embedded engine's build and the embedded model's supply chain, checked before any decode can run."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
import xllamacpp

from gym_tf.backends import embedded
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
