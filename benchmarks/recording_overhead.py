"""What `gym-tf serve --record` adds: streaming latency with recording on versus off, measured in the same run.

    python benchmarks/recording_overhead.py [--streams 64] [--requests-per-client 4] [--rounds 3] [--together]

Two `gym-tf serve` processes front the same fake upstream (tests/fake_upstream.py; by default 32 chunks 20 ms apart,
a served model's pace at 50 tokens/s), one with `--record`, one without. Each round runs both arms, in alternating
order, with `--streams` concurrent streaming clients; per-request latencies of all rounds are pooled per arm. It
prints p50 / p99 per arm, the added p50 (on - off; target: within 1 ms) and the ratio, the per-round paired
difference of p50s with a bootstrap 95% interval (many short rounds narrow it), then checks that every
request of the recording arm was recorded (the writer process keeps up). Feedback is posted on a few responses too.
`--noise-floor` adds a second server without recording (an A/A arm): the off - off difference shows how much of
the on - off difference a busy machine makes up by itself. The `paused` arm is the recording server with its kill
switch on: on - paused compares one server process with itself, the difference recording alone makes.
`--together` asks every arm the same request at the same moment, from one client process, in an order shuffled per
request (no paused arm then), and pairs each request with its twins: the machine's load at that moment, the
client's and the upstream's delays fall on both alike. Each round's median of the per-request differences (on - off,
and off2 - off with `--noise-floor`) is then averaged over rounds with a bootstrap 95% interval. That interval is
about 4x narrower than the difference of two rounds' p50s, which carries the sampling noise of both p50s (on the
2-core Xeon over 30 rounds: +/-2 ms against +/-8 ms; one arm after another, +/-21 ms over 40 rounds).

First, the request path alone, in this process (`--path-only` stops there): the serving thread's CPU time to relay a
stream onto a `Tape` and hand the finished exchanges to the writer, against relaying the same bytes
directly (see `request_path`). That is the work recording adds to the loop that serves every stream, which the
end-to-end arms cannot resolve to 1 ms on a busy 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import free_port, wait_for  # noqa: E402
from gym_tf.traffic_writer import RecordSettings  # noqa: E402
from server.recording import KILL_FILE, Recorder, relay_onto  # noqa: E402

BODY = {"model": "m", "messages": [{"role": "user", "content": "What is 6 times 7?"}], "stream": True}


async def one(client: httpx.AsyncClient, url: str) -> tuple[float, str]:
    start = time.perf_counter()
    ident = ""
    async with client.stream("POST", f"{url}/chat/completions", json=BODY) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not ident and line.startswith("data: {"):
                ident = line.split('"id": "', 1)[-1].split('"', 1)[0]
            if line == "data: [DONE]":
                break
    return time.perf_counter() - start, ident


async def ask(urls: dict[str, str], clients: int, per_client: int, seed: int = 0) -> dict[str, list[float]]:
    """One arm, or every arm at the same moment from one client process: each of `clients` workers sends the same
    request to every arm at once, in an order shuffled per request, `per_client` times. Latencies are listed in that
    order in every arm, so the i-th of one arm and the i-th of another were asked at the same moment."""
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    pools = {name: httpx.AsyncClient(limits=limits, timeout=60) for name in urls}
    order = random.Random(seed)
    try:
        for name, url in urls.items():
            await one(pools[name], url)  # warm each pool

        async def ask_all() -> dict[str, tuple[float, str]]:
            names = order.sample(list(urls), len(urls))
            answers = await asyncio.gather(*(one(pools[name], urls[name]) for name in names))
            return dict(zip(names, answers))

        async def worker() -> list[dict[str, tuple[float, str]]]:
            return [await ask_all() for _ in range(per_client)]

        asked = [row for rows in await asyncio.gather(*(worker() for _ in range(clients))) for row in rows]
        for name, url in urls.items():  # feedback rides along, as in production
            for row in asked[:8]:
                await pools[name].post(f"{url}/feedback", json={"response_id": row[name][1], "score": "up"})
    finally:
        for pool in pools.values():
            await pool.aclose()
    return {name: [row[name][0] for row in asked] for name in urls}


def p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000


def paired(a: list[float], b: list[float], resamples: int = 10_000) -> str:
    """Mean of the per-round differences a - b with a bootstrap 95% interval over rounds (rounds are the unit: the
    machine's load drifts between them, and both arms of a round share it)."""
    diffs = [x - y for x, y in zip(a, b)]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(resamples))
    return f"{statistics.fmean(diffs):+.2f} ms [{means[int(0.025 * resamples)]:+.2f}, {means[int(0.975 * resamples)]:+.2f}]"


@dataclass
class PathCost:
    """Event-loop CPU time, in microseconds: per relayed stream in each measured round, and per hand-over."""
    direct: list[float] = field(default_factory=list)
    recorded: list[float] = field(default_factory=list)
    handovers: list[float] = field(default_factory=list)


async def request_path(work: Path, streams: int, chunks: int, batch: int, rounds: int) -> PathCost:
    """The work recording adds to the serving thread: each round relays `streams` streams directly and onto a
    `Tape`, handing the finished exchanges to the writer every `batch` streams, as the server's 50 ms
    timer does. CPU time of this thread, so neither the writer process nor other jobs on the machine count; the
    pipe is drained between hand-overs, untimed, as the server's loop does between its timer's calls. Round 0 warms
    up and is not counted. Every recorded exchange must be stored, whole."""

    def stream_bytes(ident: int) -> list[bytes]:
        head = {"id": f"chatcmpl-{ident}", "object": "chat.completion.chunk", "created": 1, "model": "fake-model"}
        words = [{**head, "choices": [{"index": 0, "delta": {"content": f" w{j}"}, "finish_reason": None}]}
                 for j in range(chunks)]
        return [f"data: {json.dumps(w)}\n\n".encode() for w in words] + [b"data: [DONE]\n\n"]

    async def relay(events: list[bytes]):
        for event in events:
            yield event

    meta = {"tenant": "default", "created": time.time(), "route": "/chat/completions", "model": "fake-model",
            "library_version": "none", "request": BODY}
    recorder = Recorder(work / "ws-path", RecordSettings(flush_s=3600.0))  # the hand-overs are made below
    cost = PathCost()
    try:
        for round_ in range(rounds + 1):
            for name in ("direct", "recorded") if round_ % 2 else ("recorded", "direct"):
                bodies = [stream_bytes(round_ * streams + i) for i in range(streams)]
                spent = 0.0
                for i, events in enumerate(bodies):
                    started, wall = time.thread_time(), time.perf_counter()  # the server takes `wall` too
                    tape = recorder.tape(meta, wall) if name == "recorded" else None
                    async for _ in relay_onto(relay(events), tape, lambda: None):  # the server's own relay loop
                        pass
                    if name == "recorded" and ((i + 1) % batch == 0 or i + 1 == streams):
                        handed = time.thread_time()
                        recorder._flush()
                        if round_:
                            cost.handovers.append((time.thread_time() - handed) * 1e6)
                    spent += time.thread_time() - started
                    while recorder._out:  # the writer takes the pipe's bytes; the loop is free meanwhile
                        await asyncio.sleep(0.001)
                if round_:
                    getattr(cost, name).append(spent / streams * 1e6)
        await recorder.sync()
        dropped = recorder.dropped
    finally:
        recorder.close()
    with sqlite3.connect(work / "ws-path" / "traffic.db") as db:
        stored = db.execute("select count(*) from traffic").fetchone()[0]
        answers = db.execute("select answers from traffic where response_id = 'chatcmpl-0'").fetchone()[0]
    assert dropped == 0 and stored == streams * (rounds + 1), f"{stored} stored, {dropped} dropped"
    assert json.loads(answers) == ["".join(f" w{j}" for j in range(chunks))], answers[:200]
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-delay", type=float, default=0.02)
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--noise-floor", action="store_true", help="add a second server without recording")
    parser.add_argument("--path-streams", type=int, default=2000, help="streams per round of the request-path arm")
    parser.add_argument("--path-rounds", type=int, default=5)
    parser.add_argument("--path-batch", type=int, default=4,
                        help="exchanges per hand-over to the writer (64 streams of about 0.8 s end about 4 per 50 ms)")
    parser.add_argument("--path-only", action="store_true", help="only the request-path arm")
    parser.add_argument("--together", action="store_true",
                        help="ask every arm the same request at the same moment, from one client (no paused arm), "
                             "and pair each request with its twin: what the machine does then falls on both alike")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    path = asyncio.run(request_path(work, args.path_streams, args.chunks, args.path_batch, args.path_rounds))
    added = sorted(r - d for r, d in zip(path.recorded, path.direct))
    print(f"request path, in process: {args.path_rounds} rounds of {args.path_streams} streams of {args.chunks} "
          f"chunks, a hand-over every {args.path_batch} exchanges; CPU time of the serving thread per stream: "
          f"directly {statistics.median(path.direct):.1f} us (rounds {min(path.direct):.1f} to {max(path.direct):.1f}), "
          f"through the recorder {statistics.median(path.recorded):.1f} us ({min(path.recorded):.1f} to "
          f"{max(path.recorded):.1f}); recording adds {statistics.median(added):.1f} us ({added[0]:.1f} to "
          f"{added[-1]:.1f}); one hand-over: median {statistics.median(path.handovers):.0f} us, longest "
          f"{max(path.handovers):.0f} us; every exchange stored, whole")
    if args.path_only:
        shutil.rmtree(work, ignore_errors=True)
        return
    up_port = free_port()
    upstream = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_upstream.py"), str(up_port),
                                 str(work / "record.jsonl"), "1", str(args.chunk_delay), str(args.chunks)])
    servers, urls = {}, {}
    try:
        wait_for(f"http://127.0.0.1:{up_port}/v1/models", upstream, 30)
        arms = [("off", []), ("on", ["--record"])] + ([("off2", [])] if args.noise_floor else [])
        for name, flags in arms:
            port = free_port()
            servers[name] = subprocess.Popen(
                [sys.executable, "-m", "gym_tf", "serve", "--upstream", f"http://127.0.0.1:{up_port}/v1", "--model",
                 "fake-model", "--port", str(port), "--workspace", str(work / f"ws-{name}"), *flags],
                cwd=ROOT, stderr=subprocess.DEVNULL)
            urls[name] = f"http://127.0.0.1:{port}/v1"
            wait_for(f"http://127.0.0.1:{port}/health", servers[name], 60)
        if not args.together:
            # "paused": the recording server itself with its kill switch on, so on - paused compares one process
            # with itself (two server processes differ by more than 1 ms on their own: the off2 - off arm)
            arms.append(("paused", []))
            urls["paused"], kill_file = urls["on"], work / "ws-on" / KILL_FILE
        latencies: dict[str, list[float]] = {name: [] for name, _ in arms}
        per_round: dict[str, list[float]] = {name: [] for name, _ in arms}  # each round's p50, for the paired CI
        sent_on = 0
        names = [name for name, _ in arms]
        at_once: dict[str, list[float]] = {name: [] for name in names[1:]}  # each round's median difference
        for round_ in range(args.rounds):
            if args.together:
                results = asyncio.run(ask({n: urls[n] for n in names}, args.streams, args.requests_per_client,
                                          seed=round_))
                for name in names[1:]:  # each request's difference from the off arm's asked at the same moment
                    at_once[name].append(statistics.median(a - b for a, b in zip(results[name], results["off"])) * 1000)
            else:  # one arm after another, in alternating order
                results = {}
                for name in names if round_ % 2 == 0 else names[::-1]:
                    if name in ("on", "paused") and kill_file.exists() != (name == "paused"):
                        kill_file.touch() if name == "paused" else kill_file.unlink()
                        time.sleep(1.2)  # the server looks at the switch at most once a second
                    results |= asyncio.run(ask({name: urls[name]}, args.streams, args.requests_per_client))
            for name, values in results.items():
                latencies[name] += values
                per_round[name].append(p(values, 50))
            sent_on += len(results["on"]) + 1
            if args.together and (round_ + 1) % 10 == 0:  # a run cut short by a time limit still says something
                print(f"round {round_ + 1}: on - off per request so far, mean {statistics.fmean(at_once['on']):+.2f} ms",
                      flush=True)
        off, on = latencies["off"], latencies["on"]
        print(f"{args.streams} concurrent streams, {args.rounds} rounds x {args.requests_per_client} requests per "
              f"client per arm; upstream {args.chunks} chunks {args.chunk_delay * 1000:g} ms apart")
        print(f"recording off: p50 {p(off, 50):.2f} ms  p99 {p(off, 99):.2f} ms  ({len(off)} requests)")
        print(f"recording on:  p50 {p(on, 50):.2f} ms  p99 {p(on, 99):.2f} ms  ({len(on)} requests)")
        added, ratio = p(on, 50) - p(off, 50), p(on, 50) / p(off, 50)
        print(f"added p50 latency (on - off): {added:+.2f} ms; ratio on/off {ratio:.4f}")
        print(f"paired by round (each round's p50, on - off, {args.rounds} rounds): mean "
              f"{paired(per_round['on'], per_round['off'])}")
        if args.together:
            for name, values in at_once.items():
                print(f"{name} - off per request, asked at the same moment (each round's median difference): mean "
                      f"{paired(values, [0.0] * len(values))}")
        if "paused" in latencies:
            print(f"one server, recording on - paused (kill switch), paired by round: p50 "
                  f"{p(latencies['paused'], 50):.2f} ms paused; mean {paired(per_round['on'], per_round['paused'])}")
        if args.noise_floor:
            off2 = latencies["off2"]
            print(f"noise floor (second server, recording off): p50 {p(off2, 50):.2f} ms; off2 - off "
                  f"{p(off2, 50) - p(off, 50):+.2f} ms; paired by round {paired(per_round['off2'], per_round['off'])}")
        deadline = time.time() + 30
        while time.time() < deadline:
            with sqlite3.connect(work / "ws-on" / "traffic.db") as db:
                stored = db.execute("select count(*) from traffic").fetchone()[0]
                feedback = db.execute("select count(*) from feedback").fetchone()[0]
            if stored >= sent_on:
                break
            time.sleep(0.2)
        print(f"recorded {stored} of {sent_on} streamed requests; {feedback} feedback rows")
    finally:
        for process in [*servers.values(), upstream]:
            process.terminate()
            process.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
