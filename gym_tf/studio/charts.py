"""The run curve as inline SVG, drawn on the server: no JavaScript, no library, nothing fetched by the browser.

Train reward per step is a line; each validated candidate is a dot (filled when kept, hollow red when the gate
rejected it) with the gate's 95% interval drawn as a bar; the start library's validation score is a dashed line.
The gate's interval is on the paired difference against the best version so far, so it is drawn around that best
score: [best + low, best + high], where best = candidate score - difference.
"""

from __future__ import annotations

from html import escape
from typing import Any

WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 48, 16, 16, 36


def run_chart(steps: list[dict[str, Any]], baseline: float | None) -> str:
    """SVG markup for a run's steps (as `queries.run` returns them); empty string when there is nothing to draw."""
    train = [(s["step"], s["train_reward"]) for s in steps if s["train_reward"] is not None]
    gated = [s for s in steps if s["gate"] is not None and s["val_mean"] is not None]
    if not train and not gated:
        return ""
    values = [v for _, v in train] + [s["val_mean"] for s in gated] + ([baseline] if baseline is not None else [])
    values += [s["val_mean"] - s["gate"]["diff"] + s["gate"][end] for s in gated for end in ("low", "high")]
    low, high = min(0.0, *values), max(1.0, *values)
    last = max(s["step"] for s in steps)

    def x(step: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * (step / last if last else 0.5)

    def y(value: float) -> float:
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - (value - low) / (high - low))

    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
             f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="train reward and validation score per step">']
    for tick in _ticks(low, high):
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
                     f'<text class="axis" x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:g}</text>')
    for step in _step_ticks(last):
        parts.append(f'<text class="axis" x="{x(step):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{step}</text>')
    parts.append(f'<text class="axis" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 4}" text-anchor="middle">step</text>')
    if baseline is not None:
        parts.append(f'<line class="baseline" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(baseline):.1f}" '
                     f'y2="{y(baseline):.1f}"><title>validation, start library: {baseline:.3f}</title></line>')
    if train:
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(s):.1f},{y(v):.1f}" for i, (s, v) in enumerate(train))
        parts.append(f'<path class="train" d="{path}"><title>train reward per step</title></path>')
    for s in gated:
        best = s["val_mean"] - s["gate"]["diff"]
        kept = s["gate"]["verdict"] != "rejected"
        title = escape(f"step {s['step']}: validation {s['val_mean']:.3f}, difference {s['gate']['diff']:+.3f} "
                       f"[{s['gate']['low']:+.3f}, {s['gate']['high']:+.3f}], {s['gate']['verdict']}")
        parts.append(f'<g class="gate {"kept" if kept else "rejected"}"><title>{title}</title>'
                     f'<line x1="{x(s["step"]):.1f}" x2="{x(s["step"]):.1f}" y1="{y(best + s["gate"]["low"]):.1f}" '
                     f'y2="{y(best + s["gate"]["high"]):.1f}"/>'
                     f'<circle cx="{x(s["step"]):.1f}" cy="{y(s["val_mean"]):.1f}" r="4"/></g>')
    parts.append(f'<g class="legend" transform="translate({LEFT + 8},{TOP + 4})">'
                 '<line class="train" x1="0" x2="18" y1="6" y2="6"/><text x="24" y="10">train reward</text>'
                 '<circle class="kept" cx="130" cy="6" r="4"/><text x="140" y="10">validation (gate interval)</text>'
                 '<circle class="rejected" cx="316" cy="6" r="4"/><text x="326" y="10">rejected</text>'
                 '<line class="baseline" x1="400" x2="418" y1="6" y2="6"/><text x="424" y="10">start library</text>'
                 '</g></svg>')
    return "".join(parts)


def _ticks(low: float, high: float) -> list[float]:
    step = (high - low) / 4
    return [round(low + i * step, 3) for i in range(5)]


def _step_ticks(last: int) -> list[int]:
    if last <= 10:
        return list(range(1, last + 1))
    every = max(1, round(last / 8))
    return [s for s in range(every, last + 1, every)]
