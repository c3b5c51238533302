"""What `gym-tf serve` adds: streaming throughput and latency through the proxy versus the same upstream directly.

    python benchmarks/proxy_overhead.py [--requests-per-client 6] [--load 400]

The upstream is tests/fake_upstream.py (a FastAPI SSE server): by default 32 chunks 20 ms apart, the pace of a
served model at 50 tokens/s; `--chunk-delay 0.001 --chunks 6` makes it an upstream that costs next to nothing, so
that client, proxy and upstream fight for the CPU and the proxy's own cost shows. Each concurrency level runs direct and proxied arms alternately, twice; the best
throughput of each arm is kept. Then a bounded load run: `--load` concurrent streaming requests through the proxy,
counting errors. Targets: >= 0.95x direct throughput at 64 streams, <= 2 ms added p50 latency, zero errors.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import free_port, wait_for  # noqa: E402

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def one(client: httpx.AsyncClient, url: str) -> float:
    start = time.perf_counter()
    async with client.stream("POST", f"{url}/chat/completions", json=BODY) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if line == "data: [DONE]":
                break
        else:
            raise RuntimeError("stream ended without [DONE]")
    return time.perf_counter() - start


async def arm(url: str, clients: int, per_client: int) -> tuple[float, list[float], int]:
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        await one(client, url)  # warm the connection pool

        async def worker():
            out = []
            for _ in range(per_client):
                try:
                    out.append(await one(client, url))
                except (httpx.HTTPError, RuntimeError):
                    out.append(None)
            return out

        start = time.perf_counter()
        results = [r for batch in await asyncio.gather(*(worker() for _ in range(clients))) for r in batch]
        elapsed = time.perf_counter() - start
    latencies = [r for r in results if r is not None]
    return len(latencies) / elapsed, latencies, results.count(None)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 1 else values[0] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--load", type=int, default=400)
    parser.add_argument("--chunk-delay", type=float, default=0.02)
    parser.add_argument("--chunks", type=int, default=32)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    up_port, proxy_port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_upstream.py"), str(up_port),
                                 str(work / "record.jsonl"), "1", str(args.chunk_delay), str(args.chunks)])
    proxy = subprocess.Popen([sys.executable, "-m", "gym_tf", "serve", "--upstream", f"http://127.0.0.1:{up_port}/v1",
                              "--model", "fake-model", "--port", str(proxy_port), "--workspace", str(work / "ws")],
                             cwd=ROOT, stderr=subprocess.DEVNULL)
    direct_url, proxy_url = f"http://127.0.0.1:{up_port}/v1", f"http://127.0.0.1:{proxy_port}/v1"
    try:
        wait_for(f"{direct_url}/models", upstream, 30)
        wait_for(f"http://127.0.0.1:{proxy_port}/health", proxy, 60)
        table = Table(title=f"streaming through gym-tf serve vs direct (upstream: {args.chunks} chunks, "
                            f"{args.chunk_delay * 1000:g} ms apart)")
        for column in ("streams", "direct req/s", "proxy req/s", "ratio", "direct p50 ms", "proxy p50 ms",
                       "added p50 ms", "direct p99 ms", "proxy p99 ms", "errors"):
            table.add_column(column)
        for clients in (1, 16, 64):
            best: dict[str, tuple[float, list[float], int]] = {}
            for repeat in range(2):
                order = [("direct", direct_url), ("proxy", proxy_url)]
                for name, url in order if repeat % 2 == 0 else order[::-1]:
                    result = asyncio.run(arm(url, clients, args.requests_per_client))
                    if name not in best or result[0] > best[name][0]:
                        best[name] = result
            (d_rps, d_lat, d_err), (p_rps, p_lat, p_err) = best["direct"], best["proxy"]
            table.add_row(str(clients), f"{d_rps:.1f}", f"{p_rps:.1f}", f"{p_rps / d_rps:.3f}", f"{pct(d_lat, 50):.1f}",
                          f"{pct(p_lat, 50):.1f}", f"{pct(p_lat, 50) - pct(d_lat, 50):.2f}", f"{pct(d_lat, 99):.1f}",
                          f"{pct(p_lat, 99):.1f}", str(d_err + p_err))
        Console().print(table)
        rps, latencies, errors = asyncio.run(arm(proxy_url, args.load, 1))
        Console().print(f"load run: {args.load} concurrent streaming requests through the proxy: "
                        f"{len(latencies)} ok, {errors} errors, p99 {pct(latencies, 99):.0f} ms")
    finally:
        proxy.terminate()
        upstream.terminate()
        proxy.wait()
        upstream.wait()


if __name__ == "__main__":
    main()
