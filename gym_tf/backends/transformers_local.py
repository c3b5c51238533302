"""A local Hugging Face model (or a PEFT adapter directory) through transformers, for evaluating what
`gym-tf train` produced with the same metrics as a library (`gym-tf eval --backend transformers --model DIR`)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from gym_tf.backends.base import Choice, Generation, Messages, Sampling
from gym_tf.errors import ConfigError, ModelNotFound


class TransformersBackend:
    def __init__(self, model_dir: str):
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ConfigError(f"the transformers backend needs `pip install gym-tf[train]` ({exc})") from None
        path = Path(model_dir)
        if not path.is_dir():
            raise ModelNotFound(f"{model_dir!r} is not a local model or adapter directory")
        if (path / "adapter_config.json").exists():
            from peft import AutoPeftModelForCausalLM

            self.lm = AutoPeftModelForCausalLM.from_pretrained(str(path))
        else:
            self.lm = AutoModelForCausalLM.from_pretrained(str(path))
        self.lm.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.torch = torch
        self.model = path.name
        self.path = path
        self._lock = threading.Lock()

    def describe(self) -> str:
        return f"transformers {self.path}"

    async def generate(self, messages: Messages, n: int = 1, **sampling: Any) -> Generation:
        params = Sampling(**sampling)
        start = time.perf_counter()
        prompt_tokens, outputs = await asyncio.to_thread(self._generate, messages, n, params)
        eos = self.tokenizer.eos_token_id
        choices = []
        for ids in outputs:
            ids = ids.tolist()
            stopped = eos in ids
            ids = ids[: ids.index(eos)] if stopped else ids
            choices.append(Choice(self.tokenizer.decode(ids, skip_special_tokens=True),
                                  "stop" if stopped else "length", len(ids)))
        return Generation(choices, prompt_tokens * n, sum(c.completion_tokens for c in choices),
                          time.perf_counter() - start)

    def _generate(self, messages: Messages, n: int, params: Sampling):
        inputs = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                    return_dict=True)
        with self._lock, self.torch.no_grad():
            if params.seed is not None:
                self.torch.manual_seed(params.seed)
            out = self.lm.generate(**inputs, do_sample=params.temperature > 0, temperature=params.temperature or None,
                                   top_p=params.top_p, max_new_tokens=params.max_tokens, num_return_sequences=n,
                                   pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
        width = inputs["input_ids"].shape[1]
        return width, [row[width:] for row in out]

    async def aclose(self) -> None:
        pass
