"""Ledger speed: versions committed per second on the path `optimize` takes (`RunStore.commit_step`: the version
row, its Merkle leaf, the op verdicts and the step row in one transaction), proof generation and verification, and
end-to-end fetch + verify of a 200-item library from the embedded IPFS node.

    python benchmarks/ledger_bench.py

Baselines measured in the same run: pymerkle's SqliteTree with SQLite's default settings (what the log would get
without the WAL + synchronous=NORMAL pragmas), the bare `MerkleLog.append` (the log alone, outside any store
transaction: no production path appends this way), and reading the same library bytes from a plain file.
Targets: >= 1,000 committed steps/s (an optimize step takes seconds of LLM calls); fetch + verify of 200 items < 50 ms.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from eth_account import Account
from pymerkle import SqliteTree
from rich.console import Console

from gym_tf.library import EMPTY_LIBRARY, AddOp, Experience, LibraryVersion, OpVerdict, Provenance, apply_ops
from gym_tf.publishing import fetch, publish
from gym_tf.store import RunStore
from ledger.ipfs import EmbeddedNode
from ledger.log import MerkleLog, verify_entry

console = Console()


def appends_per_second(tree_append, count: int) -> float:
    start = time.perf_counter()
    for i in range(count):
        tree_append(f"entry {i}".encode())
    return count / (time.perf_counter() - start)


def committed_steps_per_second(store: RunStore, count: int) -> float:
    """`commit_step` as `optimize` calls it after each step, each step adding one lesson to a new version."""
    run_id = store.new_run("optimize", {}, "bench", "bench", EMPTY_LIBRARY.id)
    steps, before = [], EMPTY_LIBRARY
    for step in range(1, count + 1):
        op = AddOp(op="add", text=f"Lesson {step}: check the units, the signs and the final arithmetic once more.")
        item = Experience(id=f"E{step}", text=op.text, provenance=Provenance(step=step, op="add"))
        after = LibraryVersion(items=(item,), next_number=step + 1, parent=before.id, step=step)
        steps.append((step, before, after, [("apply", OpVerdict(op, True))]))
        before = after
    start = time.perf_counter()
    for step, before, after, verdicts in steps:
        store.commit_step(run_id, step, 0, step, before, after, verdicts, "promoted", {}, {}, "bench")
    rate = count / (time.perf_counter() - start)
    store.finish_run(run_id, "finished", {})
    return rate


def main() -> None:
    work = Path(tempfile.mkdtemp())
    plain = SqliteTree(str(work / "plain.db"))
    baseline = appends_per_second(plain.append_entry, 300)
    steps = committed_steps_per_second(RunStore(work / "steps"), 3_000)
    log = MerkleLog(work / "log.db")
    bare = appends_per_second(log.append, 20_000)
    console.print(f"committed steps/s (optimize's path: version + leaf + ops + step, one transaction): {steps:,.0f} "
                  f"(target >= 1,000); bare MerkleLog appends/s {bare:,.0f}; pymerkle with SQLite defaults "
                  f"{baseline:,.0f}/s")

    size = log.size
    start = time.perf_counter()
    proofs = [(i, log.prove(i, size)) for i in range(1, size + 1, size // 1000)]
    generated = (time.perf_counter() - start) / len(proofs)
    root = log.root(size)
    start = time.perf_counter()
    for i, proof in proofs:
        verify_entry(f"entry {i - 1}".encode(), root, proof)
    verified = (time.perf_counter() - start) / len(proofs)
    console.print(f"inclusion proofs in a {size:,}-entry log: generate {generated * 1000:.2f} ms, "
                  f"verify {verified * 1000:.2f} ms each ({len(proofs)} proofs)")

    ops = [AddOp(op="add", text=f"Lesson {i}: check the units, the signs and the final arithmetic once more.")
           for i in range(200)]
    library, _ = apply_ops(EMPTY_LIBRARY, ops, step=1)
    source = RunStore(work / "source")
    source.put_version(library, run_id="", status="promoted")
    node = EmbeddedNode(work / "ipfs")
    signer = Account.create()
    address = publish(source, library.id, signer, node).manifest_address
    file = work / "library.json"
    file.write_bytes(library.canonical_bytes())
    timings, reads = [], []
    for i in range(5):
        fresh = RunStore(work / f"fresh{i}")
        start = time.perf_counter()
        fetch(fresh, address, node, signer.address)
        timings.append(time.perf_counter() - start)
        start = time.perf_counter()
        file.read_bytes()
        reads.append(time.perf_counter() - start)
    console.print(f"fetch + verify + import of a {len(library.items)}-item library "
                  f"({len(library.canonical_bytes()):,} bytes) from the embedded node: best {min(timings) * 1000:.1f} ms, "
                  f"median {sorted(timings)[2] * 1000:.1f} ms (target < 50 ms; reading the bytes from a file: "
                  f"{min(reads) * 1000:.2f} ms)")


if __name__ == "__main__":
    main()
