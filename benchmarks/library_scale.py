"""A big library: per-request retrieval time, added latency through `gym-tf serve`, and memory, against library size.

    python benchmarks/library_scale.py                  # 50, 500, 5000 items
    python benchmarks/library_scale.py --sizes 5000 --requests 500

For each size it builds a library of generated lessons and worked examples (distinct vocabularies per topic, so
retrieval has something to find), then times `select_items` (the one function optimize, eval and serve use to pick
a request's slice) on queries it has not seen, with the index warm (a server answers many requests from one
version). `score-all` is rank-bm25 scoring every item, as retrieval did before it scored only the items that share
a word with the request: the baseline, measured in the same run. The ratio printed is time per request against the 50-item library's, measured in the same run; the added
latency through `gym-tf serve` is its registry's `text()` on the same queries (the whole per-request library cost
of a served request). It checks that every slice fits `max_tokens` and that serve's text equals eval's render.
Peak memory is the traced Python allocation for building the index. Times are this thread's CPU time per call
(wall time on a shared machine measures the neighbours).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc

from rich.console import Console
from rich.table import Table

from gym_tf.library import (EMPTY_LIBRARY, AddOp, ExampleOp, RenderPolicy, apply_ops, approx_tokens, render_library,
                            select_items, with_policy)
from gym_tf.retrieval import _index, tokens
from server.app import LibraryRegistry

TOPICS = ["fractions", "probability", "geometry", "modular", "sequences", "inequalities", "combinatorics", "algebra",
          "logarithms", "matrices", "primes", "vectors", "polynomials", "calendars", "coins", "speed"]


def make_library(size: int, seed: int = 0):
    rng = random.Random(seed)
    ops = []
    for i in range(size):
        topic = rng.choice(TOPICS)
        words = " ".join(f"{topic}{rng.randrange(200)}" for _ in range(12))
        if i % 5 == 4:
            ops.append(ExampleOp(op="example", text=f"Problem: a {topic} question about {words}?\n"
                                                    f"Solution: work the {topic} step by step. Answer: {i}"))
        else:
            ops.append(AddOp(op="add", text=f"For {topic} problems, check {words} before answering."))
    library, _ = apply_ops(EMPTY_LIBRARY, ops, step=1)
    return library


def queries(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        topic = rng.choice(TOPICS)
        out.append(f"Solve this {topic} question: " + " ".join(f"{topic}{rng.randrange(200)}" for _ in range(8)))
    return out


def timed(fn, items) -> list[float]:
    """CPU seconds of this thread per call: on a shared machine, wall time measures the neighbours."""
    times = []
    for item in items:
        start = time.thread_time()
        fn(item)
        times.append(time.thread_time() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="50,500,5000")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--max-library-tokens", type=int, default=1024)
    parser.add_argument("--lessons", type=int, default=8, help="lessons retrieved per request")
    args = parser.parse_args()
    policy = RenderPolicy(max_tokens=args.max_library_tokens, lessons=args.lessons, examples=2)
    asked = queries(args.requests)
    table = Table(title=f"per-request library cost ({args.requests} unseen queries, slice <= "
                        f"{args.max_library_tokens} tokens, {args.lessons} lessons + 2 examples)")
    for column in ("items", "select p50 CPU ms", "p99 ms", "ratio vs 50", "score-all p50 ms", "serve text p50 ms", "index build s",
                   "index MiB", "slice tokens max"):
        table.add_column(column, justify="right")
    base = None
    for size in [int(s) for s in args.sizes.split(",")]:
        library = with_policy(make_library(size), policy)
        tracemalloc.start()
        start = time.perf_counter()
        select_items(library, "warm the index")
        build = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        select = timed(lambda q: select_items(library, q), asked)
        texts = tuple(i.text for i in library.items)
        bm25 = _index(texts, 0.75)[0]
        everything = timed(lambda q: bm25.get_scores(tokens(q)), asked)  # rank-bm25 scoring every item: the old way
        serving = ServeText(library)
        serve = timed(serving.text, asked)
        largest = max(approx_tokens(render_library(library, q)) for q in asked[:50])
        assert largest <= args.max_library_tokens, "a slice broke the cap"
        assert all(serving.text(q) == render_library(library, q) for q in asked[:50]), "serve and eval differ"
        p50 = statistics.median(select)
        base = base or p50
        table.add_row(str(size), f"{1000 * p50:.2f}", f"{1000 * sorted(select)[int(0.99 * len(select))]:.2f}",
                      f"{p50 / base:.1f}", f"{1000 * statistics.median(everything):.2f}",
                      f"{1000 * statistics.median(serve):.2f}", f"{build:.2f}",
                      f"{peak / 2**20:.1f}", str(largest))
        Console().print(f"{size} items: select p50 {1000 * p50:.2f} ms", highlight=False)
    Console().print(table)


class ServeText:
    """The server's per-request path for one served version: its registry's text()."""

    def __init__(self, library):
        self.library = library
        self.registry = LibraryRegistry(store=None, max_tokens=None)  # text() never reads the store

    def text(self, query: str) -> str:
        return self.registry.text(self.library, query)


if __name__ == "__main__":
    main()
