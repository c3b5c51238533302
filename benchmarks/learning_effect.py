"""Does a learned library make the frozen model better on problems it never saw? Per task family:

    pick the family's difficulty (`--level auto`: probe reasoning-gym's level 0, then harder levels past one solved
    too often or easier ones below 0 past one solved too rarely, take the one the model solves nearest
    `--level-aim`; see gym_tf/task_levels.py)
    -> generate train / validation / test splits (reasoning-gym, one generator stream, disjoint by problem text;
       or the bundled quickstart set)
    -> `optimize` on train, validation-gated, ending with its prune step (each item left out on validation)
    -> compare no library and the learned one on test, same seeds: paired Mean@k difference with a 95% interval,
       Majority@k at equal samples, tokens spent; and, with `--test-unpruned`, when the prune step dropped items,
       the library before it (`unpruned`), so the table shows what pruning did on test; with `--test-examples N`,
       the learned library shown N worked examples per prompt instead of `--examples` (`learned, N examples`); with
       `--test-first N`, the library cut to the items learned from the first N training problems; with
       `--test-epochs`, the library the run held after each epoch but the last (`learned, after epoch E`).

Every family run is reported, gains or not. The defaults are the settings of the README's counted rows: 16 training
problems, two epochs (in the second the model answers with the first's worked examples in its prompt). 48 problems
(`--train 48`) met the target on more of the families run there, which were not drawn alike, and cost 2 to 3 times
the time; at one epoch, the default for part of 2026-11-29, its first runs missed (see the README). Since 2026-11-30
a learning time limit keeps a family near the hour on slower CPUs: the optimizer starts no learning step after
`--learn-minutes` (30) of learning, finishes the one under way and still ends with its prune step (on a 2-core Zen 5
EPYC, 16 problems over two epochs learned for 5 to 17 min in nine runs, 48 for 26 to 42 in nine; whole families at 16
took up to 60 min on an AVX2 EPYC). `--hinted-examples N` (or `auto`: 2 where the level chosen was solved under the
aim's floor in its probe) also tells the model the reference answer of each training problem it gave no example of,
and a right answer that does not say it was told can be the worked example; off by default (of five runs, one met
the target: number_sorting seed 79, at a level given by hand; seed 80 with `auto` gained +0.094, its vote not beyond
noise; count_bits seed 78 gained within noise; largest_island and binary_matrix, where every answer ran to the token
cap, learned nothing). `--labeled-examples` and `--examples-as-turns` (each `auto`: on where the level chosen was
solved under the aim's floor) let a training problem's reference answer alone be its worked example, and show worked
examples as earlier chat turns; measured on draw-1206 (benchmarks/results/draw-1206.md), `auto` by default since
2026-12-06 (rows archived before then that probed under the floor were relabelled `--examples-as-turns off
--labeled-examples off`: they did not run today's default).
Any OpenAI-compatible backend runs it for a larger model.
Its options and the settings a run records are in benchmarks/effect_cli.py; its rows, the README's table and
across-families lines, the archive and the plot in benchmarks/effect_report.py.

    python benchmarks/learning_effect.py --families leg_counting,gcd --out bench-out
    python benchmarks/learning_effect.py --families leg_counting,gcd --out bench-out --resume   # after a stop: no
    # learning step, rollout, learner reply or test group the stopped run stored is paid again
    python benchmarks/learning_effect.py --screen --families dice,syllogism,spell_backward   # which to run
    python benchmarks/learning_effect.py --archive bench-out/results.json --note "shared with a pip install"
    python benchmarks/learning_effect.py --families basic_arithmetic --base-url http://127.0.0.1:8000/v1
    python benchmarks/learning_effect.py --families chain_sum --learner-model-file qwen2.5-coder-1.5b-q4_k_m.gguf
    python benchmarks/learning_effect.py --families decimal_arithmetic --model-file qwen2.5-coder-1.5b-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gym_tf.backends import BackendConfig, make_backend  # noqa: E402
from gym_tf.backends.embedded import cpu_label  # noqa: E402
from gym_tf.compare import compare, plot  # noqa: E402
from gym_tf.config import OptimizeConfig, RolloutConfig  # noqa: E402
from gym_tf.datasets import load_dataset  # noqa: E402
from gym_tf.errors import ConfigError, StoreError  # noqa: E402
from gym_tf.evaluate import evaluate  # noqa: E402
from gym_tf.library import LibraryVersion, with_policy  # noqa: E402
from gym_tf.metrics import paired_difference  # noqa: E402
from gym_tf.optimize import Optimizer  # noqa: E402
from gym_tf.python_tool import PythonTool  # noqa: E402
from gym_tf.rollouts import Rollout  # noqa: E402
from gym_tf.store import RunStore  # noqa: E402
from gym_tf import task_levels  # noqa: E402
from benchmarks.effect_cli import (AIMS, SCREEN_PROBLEMS, arguments, hinted_examples, same_settings,  # noqa: E402
                                   settings, switched_on)
from benchmarks.effect_report import (against_arms_lines, across_lines, archive, forest, markdown,  # noqa: E402
                                      report_rows, row)
from rewards import load_reward  # noqa: E402

# reasoning-gym seeds item i with `seed + i`: one stream per --seed for the splits (SPLIT_SEED items apart, so no two
# --seed values share an item seed), the probes from the far end of it
SPLIT_SEED, PROBE_OFFSET, SCREEN_OFFSET = 1_000_000, 500_000, 750_000


def split_files(folder: Path) -> list[Path]:
    return [folder / f"{name}.jsonl" for name in ("train", "val", "test")]


def splits(family: str, args: argparse.Namespace, folder: Path, level: int | None,
           calibration: task_levels.Calibration | None = None) -> tuple[Path, Path, Path, str]:
    """Train, validation and test files, disjoint by problem text and from the problems `calibration` probed."""
    paths = split_files(folder)
    if family == "quickstart":  # the bundled 40: disjoint slices of one hand-written set
        rows = [{"id": p.id, "problem": p.problem, "answer": p.answer} for p in load_dataset("quickstart")]
        cut = [0, 16, 24, len(rows)]
        for path, (a, b) in zip(paths, zip(cut, cut[1:])):
            task_levels.write_rows(rows[a:b], path)
        return *paths, "math"
    if args.resume and all(path.exists() for path in paths):  # what the stopped run started on, never drawn again
        for path in paths:
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
            task_levels.check_settings_carried(family, level, rows)
        return *paths, task_levels.REWARD
    probed = frozenset(p.problem for level in (calibration.rates if calibration else ())
                       for p in load_dataset(str(folder / f"probe-level{level}.jsonl")))
    drawn = task_levels.split(family, {"train": args.train, "val": args.val, "test": args.test},
                              SPLIT_SEED * args.seed, level, avoid=probed)
    for problems, path in zip(drawn.values(), paths):
        task_levels.write_rows(problems, path)
    return *paths, task_levels.REWARD


async def pick_level(family: str, args: argparse.Namespace, backend, folder: Path,
                     sampling) -> tuple[int | None, task_levels.Calibration | None]:
    """`--level`: a number, the generator's defaults, or (auto) the probed level solved nearest `--level-aim`."""
    if family == "quickstart" or args.level == "default":
        return None, None
    if args.level != "auto":
        return int(args.level), None
    if not task_levels.has_levels(family):
        print(f"{family}: no difficulty levels in reasoning-gym; its default settings are used", file=sys.stderr)
        return None, None

    def probed(level, rate):
        print(f"{family}: probe level {level}: solved {rate:.2f}", file=sys.stderr, flush=True)

    calibration = await task_levels.calibrate(backend, family, SPLIT_SEED * args.seed + PROBE_OFFSET, sampling, folder,
                                              AIMS[args.level_aim], on_probe=probed,
                                              needed=args.train + args.val + args.test)
    for level in calibration.too_few:
        print(f"{family}: level {level} passed over: too few distinct problems for the splits", file=sys.stderr)
    return calibration.level, calibration


async def chosen_level(family: str, args: argparse.Namespace, backend, folder: Path,
                       sampling) -> tuple[int | None, task_levels.Calibration | None]:
    """`pick_level`, once per family folder: the choice is kept in `level.json`, so a resumed run draws the same
    splits (the probes of one level can read 0.41 in one run and 0.66 in the next)."""
    path = folder / "level.json"
    if args.resume and path.exists():
        kept = json.loads(path.read_text(encoding="utf-8"))
        same_settings(kept["settings"], settings(args), str(path))
        found = kept["calibration"]
        calibration = task_levels.Calibration(
            level=found["level"], rates={int(k): v for k, v in found["rates"].items()}, tokens=found["tokens"],
            aim=task_levels.Aim(**found["aim"]), too_few=tuple(found["too_few"])) if found else None
        return kept["level"], calibration
    level, calibration = await pick_level(family, args, backend, folder, sampling)
    path.write_text(json.dumps({"settings": settings(args), "level": level,
                                "calibration": dataclasses.asdict(calibration) if calibration else None}),
                    encoding="utf-8")
    return level, calibration


TESTED = "tested.jsonl"  # each test group as it is scored, so a stopped benchmark's resume pays none of them again


def run_files(folder: Path) -> list[Path]:
    """What a run leaves in its family's folder for `--resume` to go on from: its row, its level, its splits and
    its scored test groups. A new run removes them first, so a resume of it, stopped early, never takes another
    run's (the optimize runs in `ws` are told apart by `earlier_run`)."""
    return [folder / "comparison.json", folder / "level.json", *split_files(folder), folder / TESTED]


def tested_groups(folder: Path) -> dict[str, dict[str, list[Rollout]]]:
    """The test groups a stopped run of this folder scored, by library version and problem (a line cut short by the
    stop is dropped, and the file rewritten without it, so the next group starts a line of its own). A resume is
    refused before this where its settings differ from the stopped run's (`same_settings`)."""
    path = folder / TESTED
    kept: dict[str, dict[str, list[Rollout]]] = {}
    whole = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else ():
        try:
            group = [Rollout(**{**r, "shown": tuple(r["shown"])}) for r in json.loads(line)]
        except (ValueError, TypeError, KeyError):
            continue
        if group:
            kept.setdefault(group[0].library_version, {})[group[0].problem_id] = group
            whole.append(line + "\n")
    if path.exists():
        path.write_text("".join(whole), encoding="utf-8")
    return kept


def earlier_run(store: RunStore, config: OptimizeConfig, folder: Path) -> str | None:
    """With `--resume`: the optimize run a stopped benchmark left in the family's folder, to go on from its last
    committed step (its rollouts and learner replies are stored: nothing is paid twice), the newest where a folder
    holds more. Its settings must be these; the split files' paths may be written otherwise (the optimizer checks
    their problems against the run's)."""
    runs = [r for r in store.runs() if r["kind"] == "optimize"]  # newest first
    if not runs:
        return None
    run_id, stored = store.run_config(runs[0]["id"], "optimize", OptimizeConfig)
    paths = ("dataset", "val_dataset")
    same_settings({k: v for k, v in stored.recorded().items() if k not in paths},
                  {k: v for k, v in config.recorded().items() if k not in paths}, f"{folder}: its run {run_id}")
    return run_id


class Clock:
    """Seconds a family's run has worked, across resumes (`clock.json`, saved at each progress line): a resumed
    run starts from what the stopped one saved last; the work it redoes since that line is counted once more."""

    def __init__(self, path: Path, resume: bool):
        self.path = path
        self.resumed = resume and path.exists()
        before = json.loads(path.read_text(encoding="utf-8"))["elapsed_s"] if self.resumed else 0.0
        self.origin = time.perf_counter() - before

    def __call__(self) -> float:
        return time.perf_counter() - self.origin

    def save(self) -> float:
        elapsed = self()
        self.path.write_text(json.dumps({"elapsed_s": elapsed}), encoding="utf-8")
        return elapsed


async def one_family(family: str, args: argparse.Namespace, out: Path) -> dict:
    folder = out / family
    if args.resume and (folder / "comparison.json").exists():
        finished = json.loads((folder / "comparison.json").read_text(encoding="utf-8"))
        same_settings(finished["settings"], settings(args), str(folder / "comparison.json"))
        print(f"{family}: finished before; its row is read from {folder / 'comparison.json'}", file=sys.stderr)
        return row(finished)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in () if args.resume else run_files(folder):  # another run's, removed before anything can stop this
        stale.unlink(missing_ok=True)
    kept = tested_groups(folder) if args.resume else {}
    backend_config = BackendConfig(base_url=args.base_url, model=args.model, model_file=args.model_file,
                                   api_key=args.api_key)
    learner_config = None
    if args.learner_base_url or args.learner_model_file:  # a different (larger) model writes the library
        learner_config = BackendConfig(base_url=args.learner_base_url, model=args.learner_model,
                                       model_file=args.learner_model_file, api_key=args.api_key)
    rollout = RolloutConfig(max_completion_tokens=args.max_completion_tokens)
    store = RunStore(folder / "ws")
    engine = await make_backend(backend_config)
    learner = await make_backend(learner_config) if learner_config else None
    # the policy's answers (probe, training, test) run their programs where the tool is on; the learner's never do
    backend = PythonTool(engine) if args.python_tool else engine
    clock = Clock(folder / "clock.json", args.resume)
    try:
        level, calibration = await chosen_level(family, args, backend, folder, rollout.sampling())
        clock.save()
        train, val, test, reward = splits(family, args, folder, level, calibration)
        config = OptimizeConfig(
            dataset=str(train), val_dataset=str(val), val_samples=args.val_samples, reward=reward, epochs=args.epochs,
            batch_size=args.batch_size, group_size=args.group_size, seed=args.seed, summarize=args.summarize,
            hard_groups=args.hard_groups, examples_per_prompt=args.examples, worked_examples=args.examples > 0,
            retrieve_lessons=args.retrieve_lessons, rollout=rollout, backend=backend_config, learner=learner_config,
            prune=args.prune, learner_examples=args.learner_examples, hinted_examples=hinted_examples(args, calibration),
            labeled_examples=switched_on(args.labeled_examples, calibration),
            examples_as_turns=switched_on(args.examples_as_turns, calibration),
            examples_per_answer=args.examples_per_answer,
            refuse_copied_examples=args.refuse_copied_examples, refuse_answer_in_problem=args.refuse_answer_in_problem,
            learn_minutes=args.learn_minutes, python_tool=args.python_tool,
        )

        def progress(p):
            line = (f"{family}: step {p.step}/{p.total_steps} rollouts {p.rollouts} library {p.library_size} "
                    f"groups all wrong {p.groups_all_wrong}")
            if line != getattr(progress, "last", None):
                print(f"[{clock.save():6.0f}s] {line}", file=sys.stderr, flush=True)
                progress.last = line

        run_id = earlier_run(store, config, folder) if args.resume else None
        optimizer = Optimizer(config, store, engine, learner, run_id=run_id, on_progress=progress)
        result = await optimizer.run()
        learn_s = clock.save()
        for note in result.progress.notes:
            print(f"{family}: {note}", file=sys.stderr, flush=True)
        learning = sum(u["prompt"] + u["completion"] for u in store.usage(result.run_id).values())
        problems = load_dataset(str(test))

        def tested(arm, problem, group):
            done[arm] += 1
            with (folder / TESTED).open("a", encoding="utf-8") as f:
                f.write(json.dumps([dataclasses.asdict(r) for r in group]) + "\n")
            print(f"[{clock.save():6.0f}s] {family}: test {arm} {done[arm]}/{len(problems)}",
                  file=sys.stderr, flush=True)

        steps = store.steps(result.run_id)
        prune = next((s for s in steps if "ablation" in s["stats"]), None)
        learning_steps = {"run": sum(s["batch"] >= 0 for s in steps), "planned": optimizer.learning_steps}
        first = [p.id for p in load_dataset(str(train))[:args.test_first]] if args.test_first else None
        ends = epoch_ends(store, result.run_id) if args.test_epochs else None
        arms = compared_arms(store, result.library, learning, prune, args.test_unpruned, args.test_examples, first,
                             ends)
        # a resumed run counts on from the groups the stopped one scored (read back, not sampled again)
        done = {name: sum(len(group) == args.k for group in kept.get(library.id, {}).values())
                for name, library, _ in arms}
        comparison = await compare(backend, problems, load_reward(reward), args.k, config.rollout.sampling(), arms,
                                   seed=args.seed + 7, on_group=tested, stored=kept)
    finally:
        await backend.aclose()
        if learner:
            await learner.aclose()
    others = against_learned(comparison)
    comparison.extra.update(family=family, level="default" if level is None else level,
                            probes=dataclasses.asdict(calibration) if calibration else None,
                            model=backend.model, learner=(learner or backend).model, learn_s=learn_s, cpu=cpu_label(),
                            wall_s=clock(), resumed=clock.resumed, settings=settings(args),
                            library=[i.model_dump(mode="json") for i in result.library.items],
                            prune=prune_effect(prune, others), against_learned=others,
                            hinted_examples=config.hinted_examples, labeled_examples=config.labeled_examples,
                            examples_as_turns=config.examples_as_turns,
                            learning_steps=learning_steps)
    comparison.write(folder / "comparison.json")
    # recorded in the run's workspace as `gym-tf eval` records its own, so the studio shows it beside the run
    comparison.record(store, str(test))
    plot(comparison, folder / "comparison.png", f"{family}: {backend.model}")
    return row(comparison.to_dict())


async def screen(families: list[str], args: argparse.Namespace, out: Path) -> list[dict]:
    """Which families the model can learn from, before paying for full runs: each family's easiest level that fills
    the splits, `SCREEN_PROBLEMS` problems x 2 answers, no library, on a generator seed of its own (none of a run's
    problems). Solved: the grader's full score. Cut: answers that ran to the token cap. The method needs some
    answers right (a worked example to keep, a group to contrast); `--level auto` can climb from a family solved
    often, and go below level 0 (easier than any of reasoning-gym's levels) from one solved too rarely, so a 0.00
    here does not mean a run will find nothing."""
    backend = await make_backend(BackendConfig(base_url=args.base_url, model=args.model, model_file=args.model_file,
                                               api_key=args.api_key))
    backend = PythonTool(backend) if args.python_tool else backend
    sampling = RolloutConfig(max_completion_tokens=args.max_completion_tokens).sampling()
    seed = SPLIT_SEED * args.seed + SCREEN_OFFSET
    found = []
    try:
        for family in families:
            needed = args.train + args.val + args.test + AIMS[args.level_aim].problems  # as the run's probe counts
            path = out / f"screen-{family}.jsonl"
            try:
                levels = range(task_levels.max_level(family) + 1) if task_levels.has_levels(family) else ()
                level = next((n for n in levels if task_levels.has_problems(family, n, needed, seed)), None)
                task_levels.write(family, SCREEN_PROBLEMS, seed, path, level)
            except task_levels.GenerationError as error:  # reported with the others, the screen goes on
                found.append({"family": family, "error": str(error)})
                print(f"{family}: {error}", flush=True)
                continue
            report = await evaluate(backend, load_dataset(str(path)), load_reward(task_levels.REWARD), 2, sampling,
                                    seed=seed)
            answers = [r for group in report.rollouts.values() for r in group]
            found.append({"family": family, "level": level, "answers": len(answers),
                          "solved": sum((r.reward or 0.0) >= 1.0 for r in answers) / len(answers),
                          "mean_reward": sum(r.reward or 0.0 for r in answers) / len(answers),
                          "cut": sum(r.finish_reason == "length" for r in answers) / len(answers)})
            print(f"{family}: level {level}, solved {found[-1]['solved']:.2f}, mean reward "
                  f"{found[-1]['mean_reward']:.2f}, cut at {args.max_completion_tokens} tokens "
                  f"{found[-1]['cut']:.2f}", flush=True)
    finally:
        await backend.aclose()
    (out / "screen.json").write_text(json.dumps(found, indent=2), encoding="utf-8")
    return found


def compared_arms(store: RunStore, learned: LibraryVersion, learning: int, prune: dict | None,
                  with_unpruned: bool, examples: int | None = None, first: list[str] | None = None,
                  ends: dict[int, str] | None = None) -> list[tuple[str, LibraryVersion, int]]:
    """The libraries the test compares, each with the tokens spent learning it: none, the learned one, with
    `with_unpruned` the library before the prune step (`prune`, its step row) where that step dropped items,
    with `examples` the learned one shown that many worked examples per prompt (`shown_examples`), where that
    changes what a prompt shows (a library of 2 examples shows both either way), and with `first` (training problem
    ids) the learned one cut to the items learned from them (`learned_from`), where that keeps some items but not
    all (else its prompts are the learned or the none arm's), and with `ends` (`epoch_ends`) the library the run held
    after each earlier epoch, where it holds items and is not the learned one."""
    arms = [("none", store.version("empty"), 0), ("learned", learned, learning)]
    if with_unpruned and prune is not None and prune["version_after"] != prune["version_before"]:
        arms.append(("unpruned", store.version(prune["version_before"]), learning))
    held = sum(item.kind == "example" for item in learned.items)
    if examples is not None and min(examples, held) != min(learned.policy.examples, held):  # else: the same prompts
        arms.append((f"learned, {examples} examples", shown_examples(learned, examples), learning))
    if first is not None:
        cut = learned_from(learned, first)
        if 0 < len(cut.items) < len(learned.items):
            arms.append((f"learned, first {len(first)} problems", cut, learning))
    for epoch, version_id in (ends or {}).items():
        held = store.version(version_id)
        if held.items and version_id != learned.id:
            arms.append((f"learned, after epoch {epoch}", held, learning))
    return arms


def epoch_ends(store: RunStore, run_id: str) -> dict[int, str]:
    """The version a run held at the end of each epoch but its last (epochs counted from 1): the gate's best after
    that epoch's last step, before any prune step (which runs after the last epoch). What fewer epochs would have
    learned, but for the prune step such a run would end with."""
    steps = [s for s in store.steps(run_id) if s["batch"] >= 0]  # the prune step samples no batch
    last = {s["epoch"] + 1: s["version_after"] for s in steps}  # steps come in order: each epoch's last wins
    return {epoch: version for epoch, version in last.items() if epoch < max(last, default=0)}


def shown_examples(library: LibraryVersion, examples: int) -> LibraryVersion:
    """The library rendered with `examples` worked examples per prompt, its token budget scaled alike (so a third
    and fourth example are not cut by the budget sized for two)."""
    policy = library.policy
    budget = policy.max_tokens
    if budget is not None and policy.examples:
        budget = max(budget, math.ceil(budget * examples / policy.examples))
    return with_policy(library, policy.model_copy(update={"examples": examples, "max_tokens": budget}))


def learned_from(library: LibraryVersion, problem_ids: list[str]) -> LibraryVersion:
    """The library cut to the items learned from `problem_ids` alone (every problem of an item's provenance among
    them): what a run on those training problems could have kept, beside a run on more of them. An item that records
    no problem is dropped, as not known to come from them."""
    allowed = set(problem_ids)
    kept = [i.model_dump(mode="json") for i in library.items
            if i.provenance.problem_ids and set(i.provenance.problem_ids) <= allowed]
    return LibraryVersion.model_validate({**library.model_dump(mode="json"), "items": kept})


def against_learned(comparison) -> dict[str, dict]:
    """Each arm after the first two against the learned one, on the same problems and seeds: the paired Mean@k and
    Majority@k differences, that arm minus the learned one (what a variant of the library did on test)."""
    arms = comparison.arms
    if len(arms) < 3:
        return {}
    learned = arms[1].report
    out = {}
    for arm in arms[2:]:
        out[arm.name] = {
            what: dataclasses.asdict(paired_difference(getattr(arm.report, per)(), getattr(learned, per)(),
                                                       seed=comparison.seed))
            for what, per in (("mean", "per_problem_mean"), ("majority", "per_problem_majority"))}
    return out


def prune_effect(prune: dict | None, against: dict[str, dict]) -> dict | None:
    """What the prune step (its step row) did: items dropped (of how many), the gate's verdict, and on test the
    pruned library against the unpruned one (`against`: `against_learned`'s, unpruned minus learned, turned round)."""
    if prune is None:
        return None
    ablations = prune["stats"]["ablation"]
    out = {"items": len(ablations), "dropped": sum(not a["keep"] for a in ablations), "status": prune["status"]}
    if "unpruned" in against:
        e = against["unpruned"]["mean"]
        out["test_effect"] = {"value": -e["value"], "low": -e["high"], "high": -e["low"]}
    return out


def main() -> None:
    parser = arguments(__doc__)
    args = parser.parse_args()
    if args.plot and not args.report:
        parser.error("--plot draws the runs named by --report")
    if args.model_file and args.base_url:
        parser.error("--model-file runs the policy on the embedded engine; --base-url names a server: give one")
    if args.archive:
        runs = [r for path in args.archive for r in report_rows(json.loads(path.read_text(encoding="utf-8")))]
        try:
            print(archive(runs, args.note))
        except ConfigError as error:
            parser.exit(2, f"{parser.prog}: error: {error}\n")
        return
    if args.report:
        rows = [r for path in args.report for r in report_rows(json.loads(path.read_text(encoding="utf-8")))]
        print(markdown(rows), end="")
        for line in across_lines(rows).values():
            print("\n" + line)
        if against := against_arms_lines(rows):
            print("\nThe library minus its other test arms, same problems and seeds (positive: the library's):")
            print("\n".join(f"- {line}" for line in against))
        if args.plot:
            forest(rows, args.plot)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_label()}", flush=True)
    if args.screen:
        if "quickstart" in args.families.split(","):
            parser.error("--screen probes reasoning-gym families; quickstart has no levels to screen")
        asyncio.run(screen(args.families.split(","), args, args.out))
        return
    rows, unmade = [], []
    for family in args.families.split(","):
        try:
            rows.append(asyncio.run(one_family(family, args, args.out)))
        except task_levels.GenerationError as error:  # a family reasoning-gym cannot make or gym-tf cannot grade:
            print(f"{parser.prog}: {family} not run: {error}", file=sys.stderr, flush=True)  # the others still run
            unmade.append(family)
            continue
        except (ConfigError, StoreError) as error:  # other settings, or a run another process holds
            parser.exit(2, f"{parser.prog}: error: {error}\n")
        table = markdown(rows)
        (args.out / "results.md").write_text(table, encoding="utf-8")
        (args.out / "results.json").write_text(json.dumps(rows, indent=2), encoding="utf-8")
        print(table, flush=True)
    if unmade:
        parser.exit(2, f"{parser.prog}: error: not run: {', '.join(unmade)} (above)\n")



if __name__ == "__main__":
    main()
