"""Training step time and peak memory: full fine-tuning versus LoRA on the same tiny model, in one run.

    python benchmarks/train_memory.py [--hidden 512 --layers 6 --steps 4]

Each arm runs in its own process (peak RSS is per process); both use the same data, seed and GSPO settings.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def arm(model: str, data: str, lora: bool, steps: int, out: str) -> dict:
    from gym_tf.store import RunStore
    from gym_tf.train import TrainConfig, train

    config = TrainConfig(method="gspo", model=model, dataset=data, reward="regex", lora=lora, max_steps=steps,
                         group_size=4, prompts_per_step=2, max_completion_tokens=32, output_dir=out, save_steps=1000)
    store = RunStore(Path(out) / "ws")
    start = time.perf_counter()
    run_id, _ = train(config, store)
    wall = time.perf_counter() - start
    step_times = [s["stats"]["step_time"] for s in store.steps(run_id) if "step_time" in s["stats"]]
    return {"lora": lora, "wall_s": wall, "step_s": sorted(step_times)[len(step_times) // 2],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--arm", choices=["full", "lora"])
    parser.add_argument("--model")
    parser.add_argument("--data")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(arm(args.model, args.data, args.arm == "lora", args.steps, args.out)))
        return
    work = Path(tempfile.mkdtemp())
    subprocess.run([sys.executable, str(ROOT / "tests" / "tiny_model.py"), str(work / "model"), str(args.hidden),
                    str(args.layers)], check=True, capture_output=True)
    data = work / "data.jsonl"
    data.write_text("\n".join(json.dumps({"problem": f"Write a number ({i})", "answer": str(i), "pattern": "[0-9]"})
                              for i in range(16)))
    results = {}
    for name in ("full", "lora"):
        done = subprocess.run([sys.executable, __file__, "--arm", name, "--model", str(work / "model"), "--data", str(data),
                               "--out", str(work / name), "--steps", str(args.steps)], capture_output=True, text=True)
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    full, lora = results["full"], results["lora"]
    print(f"model: hidden {args.hidden}, {args.layers} layers; {args.steps} GSPO steps of 2 prompts x 4 samples")
    for name, r in results.items():
        print(f"{name:5s} median step {r['step_s'] * 1000:7.1f} ms   peak RSS {r['peak_rss_mb']:7.0f} MB   wall {r['wall_s']:.1f} s")
    print(f"lora / full: step time x{lora['step_s'] / full['step_s']:.2f}, peak memory x{lora['peak_rss_mb'] / full['peak_rss_mb']:.2f}")


if __name__ == "__main__":
    main()
