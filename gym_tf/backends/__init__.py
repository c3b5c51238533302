"""Inference backends behind one interface. `make_backend(BackendConfig(...))` picks one:

- `openai`: any OpenAI-compatible server (`base_url` given)
- `embedded`: llama.cpp in-process on the packaged default model or a `model_file` (no `base_url`)
- `vllm`: vLLM's engine in-process on a local HF model directory (`pip install gym-tf[vllm]`)
- `transformers`: a local HF model or PEFT adapter directory (`pip install gym-tf[train]`), for trained outputs
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_tf.backends.base import Backend, Choice, Generation, Messages, Sampling, split_tokens
from gym_tf.errors import ConfigError

__all__ = ["Backend", "BackendConfig", "Choice", "Generation", "Messages", "Sampling", "make_backend", "split_tokens"]


class BackendConfig(BaseModel):
    """Where the frozen model lives and how hard to push it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["auto", "embedded", "openai", "vllm", "transformers"] = Field(
        "auto", description="auto: openai when base_url is set, else embedded"
    )
    base_url: str | None = Field(None, description="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    model: str | None = Field(None, description="model name on the server, or a local HF directory for vllm")
    api_key: str | None = Field(None, description="API key for the server (never recorded in the run store)")
    model_file: str | None = Field(None, description="a local GGUF file for the embedded backend")
    replicas: tuple[str, ...] = Field(
        (), description="more servers of the same model; requests spread over base_url and these by least "
                        "outstanding requests, with failover")
    concurrency: int = Field(8, ge=1, description="requests in flight at once against each server (the start, if adaptive)")
    adaptive_concurrency: bool = Field(
        False, description="grow the limit while the server keeps its speed per token, shrink it on queueing, 429 "
                           "or timeouts")
    timeout_s: float = Field(600.0, gt=0, description="per-request timeout in seconds")
    max_retries: int = Field(3, ge=0, description="retries with backoff on connection errors, 429 and 5xx")
    n_ctx: int = Field(4096, ge=256, description="context length for in-process engines")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vllm: share of GPU memory (host memory on CPU builds) to reserve; vLLM's default if unset"
    )

    @model_validator(mode="after")
    def _check(self) -> "BackendConfig":
        if self.backend == "openai" and not self.base_url:
            raise ValueError("backend 'openai' needs base_url (the server's /v1 address)")
        if self.replicas and not self.base_url:
            raise ValueError("replicas need base_url: they are more servers like it")
        if self.backend in ("vllm", "transformers") and not self.model:
            raise ValueError(f"backend {self.backend!r} needs model (a local HF model directory)")
        return self

    @property
    def kind(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "openai" if self.base_url else "embedded"

    def recorded(self) -> dict:
        """What the run store keeps: everything but the secret."""
        return self.model_dump(exclude={"api_key"})


async def make_backend(config: BackendConfig) -> Backend:
    """Build and check the configured backend; a dead server or unknown model fails here with a clear error."""
    kind = config.kind
    if kind == "openai":
        from gym_tf.backends.openai_http import OpenAIBackend

        urls = [config.base_url or "", *config.replicas]
        # In a fleet, a failing replica is left for another at once; the fleet retries rounds, not each replica.
        retries = config.max_retries if len(urls) == 1 else 0
        members = [OpenAIBackend(url, config.model, config.api_key, config.concurrency, config.timeout_s, retries,
                                 adaptive=config.adaptive_concurrency) for url in urls]
        if len(members) == 1:
            backend = members[0]
        else:
            from gym_tf.backends.fleet import FleetBackend

            backend = FleetBackend(members, max_rounds=config.max_retries + 1)
        await backend.check()
        return backend
    if kind == "embedded":
        from gym_tf.backends.embedded import EmbeddedBackend

        return EmbeddedBackend(config.model_file, n_ctx=config.n_ctx)
    if kind == "vllm":
        from gym_tf.backends.vllm_local import VLLMBackend

        extra = {"gpu_memory_utilization": config.gpu_memory_utilization} if config.gpu_memory_utilization else {}
        return VLLMBackend(config.model or "", max_model_len=config.n_ctx, **extra)
    if kind == "transformers":
        from gym_tf.backends.transformers_local import TransformersBackend

        return TransformersBackend(config.model or "")
    raise ConfigError(f"unknown backend {kind!r}")
