"""A fake frozen model behind a real OpenAI-compatible HTTP server, for end-to-end learning tests through the CLI.

    python tests/fake_model_server.py PORT

Solve requests (a quickstart problem as the last user message) are answered right with a chance that rises when a
learned library is in the system message (0.9 against 0.3), drawn from a hash of (problem, seed, choice): the same
request gets the same answers. Learner prompts get the well-behaved scripted learner of tests/fakes.py.
"""

import hashlib
import sys
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request

sys.path.insert(0, str(Path(__file__).parent))
from fakes import _stage, default_learner, solve_text  # noqa: E402
from gym_tf.datasets import load_dataset  # noqa: E402

ANSWERS = {p.problem: p.answer for p in load_dataset("quickstart")}
app = FastAPI()


@app.get("/v1/models")
async def models():
    return {"object": "list", "data": [{"id": "fake-frozen", "object": "model", "created": 0, "owned_by": "test"}]}


@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json()
    messages = body["messages"]
    last = messages[-1]["content"] if isinstance(messages[-1]["content"], str) else ""
    system = " ".join(str(m["content"]) for m in messages if m["role"] == "system")
    texts = []
    for i in range(body.get("n") or 1):
        if last in ANSWERS:
            skill = 0.9 if ("Experiences learned" in system or "Worked examples" in system) else 0.3
            draw = int(hashlib.sha256(f"{last}:{body.get('seed')}:{i}".encode()).hexdigest(), 16) % 1000
            texts.append(solve_text(last, ANSWERS[last] if draw < skill * 1000 else "wrong"))
        else:
            texts.append(default_learner(_stage(messages[0]["content"]), messages[0]["content"]))
    completion = sum(len(t.split()) for t in texts)
    return {"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()),
            "model": "fake-frozen",
            "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
                        for i, t in enumerate(texts)],
            "usage": {"prompt_tokens": 20, "completion_tokens": completion, "total_tokens": 20 + completion}}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
