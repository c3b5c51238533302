"""A small OpenAI-compatible upstream for proxy tests: records every body it receives (one JSON line each) and
answers deterministically. Runs as its own process so a test can kill it mid-stream.

    python tests/fake_upstream.py PORT RECORD_FILE SUPPORTS_N(0|1) CHUNK_DELAY_S [CHUNKS]

A stream misbehaves on request, by the last message's content: `bad-line` sends an unparsable event after the
first word, `no-usage` never sends usage, `usage-in-last` folds usage into the last choice chunk (as llama.cpp's
/completions does), `linger` holds the connection open 2 s after [DONE]. GET /stats reports the most requests it ever had in flight at once.
"""

import asyncio
import json
import sys
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

PORT, RECORD, SUPPORTS_N, DELAY = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", float(sys.argv[4])
WORDS = ["Hello", " from", " the", " fake", " upstream", "."]
if len(sys.argv) > 5:
    WORDS = [f" w{i}" for i in range(int(sys.argv[5]))]
app = FastAPI()
in_flight = {"now": 0, "max": 0}


def record(body):
    with open(RECORD, "a") as f:
        f.write(json.dumps(body) + "\n")


@app.get("/stats")
async def stats():
    return {"max_in_flight": in_flight["max"]}


@app.get("/v1/models")
async def models():
    return {"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "test"}]}


@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json()
    record(body)
    in_flight["now"] += 1
    in_flight["max"] = max(in_flight["max"], in_flight["now"])
    try:
        return await answer(body)
    finally:
        if not body.get("stream"):
            in_flight["now"] -= 1


async def answer(body):
    n = (body.get("n") or 1) if SUPPORTS_N else 1
    messages = body.get("messages") or [{}]
    mode = str(messages[-1].get("content")) if isinstance(messages[-1], dict) else ""
    ident = {"id": f"chatcmpl-{time.time_ns()}", "created": 1, "model": body["model"]}
    usage = {"prompt_tokens": 10, "completion_tokens": len(WORDS) * n, "total_tokens": 10 + len(WORDS) * n}
    if not body.get("stream"):
        await asyncio.sleep(DELAY)
        return {**ident, "object": "chat.completion", "usage": usage, "choices": [
            {"index": i, "message": {"role": "assistant", "content": "".join(WORDS)}, "finish_reason": "stop"}
            for i in range(n)]}

    wants_usage = (body.get("stream_options") or {}).get("include_usage") and mode != "no-usage"

    async def events():
        try:
            for i in range(n):
                yield f"data: {json.dumps({**ident, 'object': 'chat.completion.chunk', 'choices': [{'index': i, 'delta': {'role': 'assistant', 'content': ''}, 'finish_reason': None}]})}\n\n"
            for word in WORDS:
                await asyncio.sleep(DELAY)
                for i in range(n):
                    yield f"data: {json.dumps({**ident, 'object': 'chat.completion.chunk', 'choices': [{'index': i, 'delta': {'content': word}, 'finish_reason': None}]})}\n\n"
                if mode == "bad-line":
                    yield "data: {not json\n\n"
            for i in range(n):
                last = {**ident, 'object': 'chat.completion.chunk', 'choices': [{'index': i, 'delta': {}, 'finish_reason': 'stop'}]}
                if mode == "usage-in-last" and i == n - 1:
                    last["usage"] = usage
                yield f"data: {json.dumps(last)}\n\n"
            if wants_usage and mode != "usage-in-last":
                yield f"data: {json.dumps({**ident, 'object': 'chat.completion.chunk', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
            if mode == "linger":
                await asyncio.sleep(2.0)
        finally:
            in_flight["now"] -= 1

    return StreamingResponse(events(), media_type="text/event-stream")


@app.post("/v1/completions")
async def completions(request: Request):
    body = await request.json()
    record(body)
    prompt = body.get("prompt")
    prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], str) else [prompt]
    reply = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": body.get("model"),
             "choices": [{"index": i, "text": " done", "finish_reason": "stop", "logprobs": None} for i in range(len(prompts))],
             "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}
    if not body.get("stream"):
        return reply

    async def events():  # one chunk carrying everything, usage folded in as llama.cpp does, then [DONE]
        yield f"data: {json.dumps(reply)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
