"""Run inside the vLLM environment: drive gym-tf's in-process vLLM backend and print what came back as JSON."""

import asyncio
import json
import sys

from gym_tf.backends import BackendConfig, make_backend
from gym_tf.library import ops_schema


async def main(model_dir: str) -> dict:
    backend = await make_backend(BackendConfig(backend="vllm", model=model_dir, n_ctx=512, gpu_memory_utilization=0.15))
    group = await backend.generate([{"role": "user", "content": "What is 2+2?"}], n=3, temperature=0.8, max_tokens=8, seed=1)
    ops = await backend.generate([{"role": "user", "content": "ops"}], n=1, temperature=0.8, max_tokens=12,
                                 json_schema=ops_schema(1))
    return {
        "model": backend.model,
        "choices": [[c.text, c.finish_reason, c.completion_tokens] for c in group.choices],
        "prompt_tokens": group.prompt_tokens,
        "completion_tokens": group.completion_tokens,
        "ops_text": ops.choices[0].text,
    }


if __name__ == "__main__":  # vLLM's worker processes re-import this module: the guard is required
    print("RESULT " + json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
