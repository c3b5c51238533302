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
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gym_tf.backends import BackendConfig, make_backend  # noqa: E402
from gym_tf.backends.embedded import cpu_label  # noqa: E402
from gym_tf.compare import compare, plot  # noqa: E402
from gym_tf.config import OptimizeConfig, RolloutConfig  # noqa: E402
from gym_tf.datasets import load_dataset  # noqa: E402
from gym_tf.errors import ConfigError, StoreError  # noqa: E402
from gym_tf.evaluate import evaluate  # noqa: E402
from gym_tf.library import LibraryVersion, with_policy  # noqa: E402
from gym_tf.metrics import bootstrap, paired_difference  # noqa: E402
from gym_tf.optimize import Optimizer  # noqa: E402
from gym_tf.python_tool import PythonTool  # noqa: E402
from gym_tf.rollouts import Rollout  # noqa: E402
from gym_tf.store import RunStore  # noqa: E402
from gym_tf import task_levels  # noqa: E402
from rewards import load_reward  # noqa: E402

DEFAULT_FAMILIES = "leg_counting,gcd,basic_arithmetic,time_intervals"
# reasoning-gym seeds item i with `seed + i`: one stream per --seed for the splits (SPLIT_SEED items apart, so no two
# --seed values share an item seed), the probes from the far end of it
SPLIT_SEED, PROBE_OFFSET, SCREEN_OFFSET = 1_000_000, 500_000, 750_000
SCREEN_PROBLEMS = 8
ARCHIVE = Path(__file__).resolve().parent / "results" / "learning_effect.json"
README = Path(__file__).resolve().parents[1] / "README.md"
TABLE_MARK = "<!-- learning-effect-table -->"
AIMS = {"band": task_levels.AIM, "half": task_levels.FIRST_AIM}
HINTED_ANSWERS = 2  # `--hinted-examples auto`: answers told the reference answer, per problem without an example
# the training-set size of every run before --train was varied (and the default still): rows that did not record
# their size ran it, unless their label names another
FIRST_TRAIN = 16
LEARN_MINUTES = 30.0  # the default learning time limit since 2026-11-30 (see the module's docstring)
# the settings a count across families is kept apart by: each (training problems, epochs) run gets a line of its own
COUNTED_APART = ("train", "epochs")


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


# how the benchmark is invoked, not what a family's run is (and the API key, which no file keeps)
NOT_SETTINGS = frozenset({"resume", "out", "report", "plot", "screen", "archive", "note", "families", "api_key"})
# settings added after runs were recorded, with the value those runs had
LATER_SETTINGS = {"examples_per_answer": "None", "refuse_copied_examples": "False", "test_examples": "None",
                  "test_first": "None", "test_epochs": "False",
                  "refuse_answer_in_problem": "False", "learn_minutes": "None",
                  "hinted_examples": "0", "python_tool": "False", "labeled_examples": "off",
                  "examples_as_turns": "off"}
# the settings whose `auto` switches on only where the level chosen was solved under the aim's floor in its probe
AUTO_SWITCHES = ("labeled_examples", "examples_as_turns")
# settings since removed (each sample shown its own examples: no gain in three A/Bs), with the value that runs without
# them had: a run recorded with that value resumes as it was
RETIRED_SETTINGS = {"test_vary": "False", "vary_examples": "False"}


def settings(args: argparse.Namespace) -> dict[str, str]:
    """The arguments that make a family's run what it is, as its files record them."""
    return {k: str(v) for k, v in vars(args).items() if k not in NOT_SETTINGS}


def same_settings(recorded: dict, now: dict, what: str) -> None:
    """A resume repeats exactly what was started: refuse, naming them, settings that differ from the recorded."""
    changed = sorted(k for k in (recorded.keys() | now.keys()) - NOT_SETTINGS
                     if recorded.get(k, LATER_SETTINGS.get(k)) != now.get(k, RETIRED_SETTINGS.get(k)))
    if changed:
        raise ConfigError(f"{what} was made with other settings ({', '.join(changed)}); resume with the arguments "
                          "it was started with, or give another --out")


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
        done: dict[str, int] = {}

        def tested(arm, problem, group):
            done[arm] = done.get(arm, 0) + 1
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


# what a run is on (the problems, the difficulty, the engine), not how it learns: none of these takes a row out of
# the count across families (a row's model and learner columns say which engine)
RUN_CHOICES = frozenset({"seed", "level", "level_aim", "base_url", "model", "model_file", "learner_base_url",
                         "learner_model", "learner_model_file",
                         "learn_minutes"})  # a cap on the machine's time, not the method: a row says where it bit
# test arms added beside the learned one: they change neither the library learned nor how its arm is sampled
EXTRA_ARMS = frozenset({"test_unpruned", "test_examples", "test_first", "test_epochs"})


def changed_settings(recorded: dict) -> str:
    """The method settings a run changed from the benchmark's defaults, as its command line wrote them
    ("--refuse-copied-examples", "--examples-per-answer 1"); empty at the defaults."""
    parser = arguments()
    defaults = settings(parser.parse_args([]))
    flags = {action.dest: action.option_strings for action in parser._actions}  # ["--prune", "--no-prune"], ["-k"]
    words = []
    for key in sorted(defaults.keys() - NOT_SETTINGS - RUN_CHOICES - EXTRA_ARMS):
        value = recorded.get(key, LATER_SETTINGS.get(key, defaults[key]))
        if value != defaults[key]:
            flag = flags[key]
            words.append(flag[0] if value == "True" else flag[-1] if value == "False" else f"{flag[0]} {value}")
    return " ".join(words)


def as_run(c: dict) -> dict[str, str]:
    """A run's recorded settings, with `--labeled-examples` and `--examples-as-turns` read as `auto` (the default)
    where the run had each on or off exactly as `auto` would have had it on its probe: a run recorded before they
    existed (off) at a level given or probed at the floor or above ran the default. Runs from before the floor
    (2026-12-02) are read against today's: `auto` would switch on where their level probed under it."""
    probes = c.get("probes")
    rates = {str(level): rate for level, rate in probes["rates"].items()} if probes else {}  # int keys before JSON
    rate = rates.get(str(c.get("level")))
    auto_on = rate is not None and rate < ((probes.get("aim") or {}).get("floor") or task_levels.AIM.floor)
    return c["settings"] | {key: "auto" for key in AUTO_SWITCHES if bool(c.get(key)) == auto_on
                            and c["settings"].get(key, LATER_SETTINGS[key]) in ("on", "off")}


def row(c: dict) -> dict:
    """One table row from a family's comparison.json; a run off the method's defaults names them with its family
    ("polynomial_equations (--examples-per-answer 1)"), which keeps it out of the count across families."""
    none, learned = c["arms"][:2]
    interval = lambda e: (e["value"], e["low"], e["high"])  # noqa: E731
    changed = changed_settings(as_run(c))
    return {"family": c["family"] + (f" ({changed})" if changed else ""), "seed": c["settings"]["seed"],
            "epochs": int(c["settings"].get("epochs", 1)), "train": int(c["settings"].get("train", FIRST_TRAIN)),
            "level": level_text(c), "model": c["model"],
            "learner": c.get("learner", c["model"]), "test": c["problems"],
            "k": c["samples"],
            "items": learned["library_items"], "lessons": sum(i.get("kind", "lesson") == "lesson" for i in c["library"]),
            "same_as": learned.get("same_as"),  # the gate kept nothing: the learned arm is the `none` arm's samples
            "none_mean": none["metrics"]["mean_at_k"]["value"], "learned_mean": learned["metrics"]["mean_at_k"]["value"],
            "diff": interval(learned["mean_vs_baseline"]),
            "none_majority": none["metrics"]["majority"]["value"],
            "learned_majority": learned["metrics"]["majority"]["value"],
            "majority_diff": interval(learned["majority_vs_baseline"]),
            "mean_minus_none_majority": interval(learned["mean_vs_baseline_majority"]),
            # the most common test answer given to every problem (recorded since 2026-11-27; None before)
            "constant": c.get("constant_answer"),
            "mean_minus_constant": learned.get("mean_vs_constant") and interval(learned["mean_vs_constant"]),
            # the gain on the test problems that answer gets wrong (recorded since 2026-11-28)
            "diff_where_constant_wrong": learned.get("mean_vs_baseline_uncommon")
            and interval(learned["mean_vs_baseline_uncommon"]),
            # the gain on the test problems that do not state their own answer, where some do (since 2026-11-29)
            "diff_where_unstated": learned.get("mean_vs_baseline_unstated")
            and interval(learned["mean_vs_baseline_unstated"]),
            # the learned arm's test answers that repeat a worked example shown to them (recorded since 2026-11-28)
            "copies": learned.get("copies"),
            "extra_prompt_tokens": c["extra_prompt_tokens_per_call"][learned["name"]], "prune": c.get("prune"),
            # the extra test arms against the learned one (recorded since 2026-11-28)
            "against_learned": c.get("against_learned") or None,
            "arm_items": {a["name"]: a["library_items"] for a in c["arms"][2:]} or None,
            "learning_tokens": learned["tokens"]["learning"], "wall_min": c["wall_s"] / 60, "cpu": c.get("cpu"),
            # the learning steps run and planned, and the time limit (recorded since 2026-11-30)
            "learning_steps": c.get("learning_steps"), "learn_minutes": minutes_arg(c["settings"].get("learn_minutes",
                                                                                                    "none")),
            # the answers per problem told the reference answer (recorded since 2026-12-02; None before: 0)
            "hinted_examples": c.get("hinted_examples"),
            # whether reference answers alone could be worked examples (recorded since 2026-12-06; None before: no)
            "labeled_examples": c.get("labeled_examples"), "examples_as_turns": c.get("examples_as_turns")}


def level_text(c: dict) -> str:
    """The level column: the level, and how the probes chose it (each probed level's solve rate, the aim, tokens;
    runs before the aim was recorded aimed at 0.5; levels passed over for too few distinct problems)."""
    level = str(c.get("level", "default"))
    probes = c.get("probes")
    if not probes:
        return level
    aim = f", aim {probes['aim']['target']:.2f}" if "aim" in probes else ""
    skipped = sorted(int(s) for s in probes.get("too_few") or ())
    passed_over = f"{level_span(skipped)}: too few problems; " if skipped else ""
    rates = probes["rates"]
    if any(int(probed) < 0 for probed in rates):  # probed down from level 0: each rate names its level
        read = ", ".join(f"level {probed} {rate:.2f}" for probed, rate in rates.items())
    else:
        read = (f"level {min(rates, key=int)} " if skipped else "") + "/".join(f"{r:.2f}" for r in rates.values())
    return level + " (" + passed_over + "probe " + read + aim + f"; {probes['tokens']:,} tok)"


def level_span(levels: list[int]) -> str:
    """Sorted levels as few words: "level 3", "levels 0-4", "levels 0, 2"."""
    if len(levels) == 1:
        return f"level {levels[0]}"
    if levels == list(range(levels[0], levels[-1] + 1)):
        return f"levels {levels[0]}-{levels[-1]}"
    return "levels " + ", ".join(map(str, levels))


def report_rows(data: dict | list) -> list[dict]:
    """Table rows from a family's comparison.json, or a list of rows as they are (a run's results.json)."""
    return data if isinstance(data, list) else [row(data)]


def forest(rows: list[dict], path: Path) -> list[str]:
    """Every run on one line, as a PNG: the library against no library (paired Mean@k difference), and against the
    no-library majority vote at the same k both the library's single-sample accuracy and its own vote, each with
    its 95% interval. Green: the interval lies above 0; red: below; grey: it holds 0. Each line's label gives the
    no-library Mean@k, the difficulty the run met, the epochs where not 1 (rows archived before the field was
    recorded ran 1) and the training problems where not 16. Returns the labels, top to bottom."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['family'].split(' (')[0]} {r['seed']}, {r['model']}"
              + (f" (learner {r['learner']})" if r.get("learner", r["model"]) != r["model"] else "")
              + (f", {epochs_text(r)}" if epochs_text(r) else "")
              + (f", {train_of(r)} problems" if train_of(r) != FIRST_TRAIN else "")
              + f", no library {r['none_mean']:.2f}"
              + (" *" if " (" in r["family"] else "") for r in rows]
    fig, panels = plt.subplots(1, 3, sharey=True, figsize=(14, 1.2 + 0.32 * len(rows)))
    for ax, key, title in ((panels[0], "diff", "library - no library, Mean@k"),
                           (panels[1], "mean_minus_none_majority", "library Mean@k - no-library Majority@k"),
                           (panels[2], "majority_diff", "library Majority@k - no-library Majority@k")):
        for y, r in enumerate(rows):
            value, low, high = r[key]
            color = "tab:green" if low > 0 else "tab:red" if high < 0 else "grey"
            ax.errorbar(value, y, xerr=[[value - low], [high - value]], fmt="o", color=color, capsize=3)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("difference in accuracy, 95% interval")
    panels[0].set_yticks(range(len(rows)), labels, fontsize=8)
    panels[0].invert_yaxis()
    fig.suptitle("Held-out test problems, the same problems and seeds in both arms "
                 "(* an earlier rule or another setting; see the table)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return labels


def against_arms_lines(rows: list[dict]) -> list[str]:
    """Each run's library against its extra test arms (the cut to its first N training problems, the unpruned
    library), the library minus the arm: what the archive keeps as the arm minus the library, turned round, so a
    positive figure is the library's. An arm that held no item is the empty library sampled a second time, not a
    variant of the library, and is left out."""
    turned = lambda x: -x + 0.0  # noqa: E731  (a bound of exactly 0 prints +0.000, not -0.000)
    ci = lambda d: f"{turned(d['value']):+.3f} [{turned(d['high']):+.3f}, {turned(d['low']):+.3f}]"  # noqa: E731
    lines = []
    for r in rows:
        for arm, against in (r.get("against_learned") or {}).items():
            if (r.get("arm_items") or {}).get(arm) == 0:
                continue
            lines.append(f"{r['family']} {r['seed']}: the library against `{arm}`: {ci(against['mean'])}, "
                         f"vote {ci(against['majority'])}")
    return lines


def markdown(rows: list[dict]) -> str:
    ci = lambda e: f"{e[0]:+.3f} [{e[1]:+.3f}, {e[2]:+.3f}]"  # noqa: E731
    head = ("| family | seed | level | policy | learner | test x k | none Mean@k | learned Mean@k | Mean@k diff [95% CI] | none Maj@k | learned Maj@k | "
            "Maj@k diff [95% CI] | learned Mean@k - none Maj@k | learned Mean@k - the most common answer always | "
            "items (lessons) | pruned: dropped, test effect | extra prompt tok/call | learning tokens | wall |\n"
            + "|---" * 19 + "|\n")
    return head + "".join(
        f"| {r['family']} | {r['seed']} | {r['level']} | {r['model']} | {r['learner']} | {r['test']} x {r['k']} | {r['none_mean']:.3f} | {r['learned_mean']:.3f} | {ci(r['diff'])} | "
        f"{r['none_majority']:.3f} | {r['learned_majority']:.3f} | {ci(r['majority_diff'])} | "
        f"{ci(r['mean_minus_none_majority'])} | {constant_cell(r, ci)} | {r['items']} ({r['lessons']}){same(r)} | {pruned(r)} | "
        f"{r['extra_prompt_tokens']:+.0f} | "
        f"{r['learning_tokens']:,} | {wall(r)} |\n" for r in rows)


def archive(runs: list[dict], note: str | None, archive_path: Path = ARCHIVE, readme: Path = README) -> str:
    """Record finished runs (rows of their results.json): newest first in the archive, with `note` (what else shared
    the CPU) in their wall column; their lines at the top of the README's table, and the README's across-families
    lines rewritten to count them (one at the defaults, one for each other --train / --epochs setting run). Returns
    the new lines. A run already archived is refused."""
    rows = json.loads(archive_path.read_text(encoding="utf-8"))
    text = readme.read_text(encoding="utf-8")
    stated = across_lines(rows)
    if TABLE_MARK + "\n" not in text or None not in stated or any(line not in text for line in stated.values()):
        raise ConfigError(f"{readme} does not hold the archive's table ({TABLE_MARK}) and across-families line; "
                          "fix it before archiving")
    note = note and " ".join(note.replace("|", "/").split())  # one table cell
    added = [r | {"train": train_of(r), "model": model_size(r["model"]), "learner": model_size(r["learner"])}
             | ({"note": note} if note else {}) for r in runs]
    unnoted = lambda r: {k: v for k, v in r.items() if k != "note"}  # noqa: E731
    if again := [r["family"] for r in added if unnoted(r) in map(unnoted, rows)]:
        raise ConfigError(f"already archived: {', '.join(again)}")
    rows = added + rows
    head, table = text.split(TABLE_MARK + "\n", 1)
    columns = "".join(table.splitlines(keepends=True)[:2])
    lines = markdown(added).splitlines(keepends=True)[2:]
    text = head + TABLE_MARK + "\n" + columns + "".join(lines) + table[len(columns):]
    after = across_lines(rows)
    previous = None
    for setting, line in after.items():  # a setting run for the first time: a line under the one before
        if setting in stated:
            text = text.replace(stated[setting], line)
        else:
            at = text.index(after[previous])
            end = text.find("\n", at) if "\n" in text[at:] else len(text)
            indent = re.match(r"[ \t]*", text[text.rfind("\n", 0, at) + 1:at])[0]
            text = text[:end] + "\n" + indent + line + text[end:]
        previous = setting
    archive_path.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    readme.write_text(text, encoding="utf-8")
    return "\n".join(after.values())


def model_size(name: str) -> str:
    """A model as the table names it, by its size ("qwen2.5-coder-0.5b-instruct-q4" is the 0.5B); other names, and
    names with no one size ("mixtral-8x7b"), as they are."""
    sizes = re.findall(r"(?<![\d.x])(\d+(?:\.\d+)?)b(?![a-z])", Path(name).name.lower())
    return f"{sizes[-1]}B" if len(sizes) == 1 else name


def constant_cell(r: dict, ci) -> str:
    """The learned arm against the most common test answer given to every problem: what it scores, the paired
    difference ("not recorded" for runs before 2026-11-27), and the gain over no library on the problems that answer
    gets wrong (since 2026-11-28); and where some test problems state their own answer, the gain on the others
    (since 2026-11-29)."""
    if not r.get("constant"):
        return "not recorded"
    wrong, unstated = r.get("diff_where_constant_wrong"), r.get("diff_where_unstated")
    return (f"{ci(r['mean_minus_constant'])} ({r['constant']['answer'][:20].replace('|', '/')!r} always: "
            f"{r['constant']['mean']:.3f}" + (f"; the gain where it is wrong: {ci(wrong)}" if wrong else "") + ")"
            + (f"; the gain where the problem does not state its answer: {ci(unstated)}" if unstated else ""))


def across_families(rows: list[dict], policy: str = "0.5B", setting: tuple[int, int] | None = None) -> dict | None:
    """The families run, taken together: each family's first row in `rows` (the archive keeps them newest first) that
    ran the benchmark's defaults (`policy` answering and learning, the default test split and k; a family named with
    a setting in brackets ran another), or the defaults but for `setting` (training problems, epochs). Rows that did
    not record their epochs ran an earlier method and are counted nowhere. The families
    that meet the target (the Mean@k gain's interval and the vote's above 0), those with the gain alone, those below
    no library, those that kept no item; and the mean gain over these families with a percentile bootstrap 95%
    interval that resamples families. That interval is for the average over the families run, not a prediction for
    one new family: `spread` gives the families' range. `every_run` counts every such row, reruns included, and
    `best` the families with at least one row that met both (`beyond`: beyond the shortcuts too: the most common
    answer given every time, and the answer a test problem states, `no_gain_where_unstated`), since a count by the
    latest row drifts as near misses are rerun."""
    defaults = arguments().parse_args([])
    default = default_setting()
    setting = default if setting is None else setting
    at_defaults = [r | {"family": family} for r in rows
                   if (family := family_at(r, setting)) and r["model"] == policy
                   and r.get("learner", r["model"]) == policy
                   and r["test"] == defaults.test and r["k"] == defaults.k]
    if not at_defaults:
        return None
    latest: dict[str, dict] = {}
    for r in at_defaults:
        latest.setdefault(r["family"], r)
    runs = list(latest.values())
    over = lambda key, among=runs: bootstrap(np.array([r[key][0] for r in among]), resamples=10_000)  # noqa: E731
    met = lambda r: r["diff"][1] > 0 and r["majority_diff"][1] > 0  # noqa: E731
    both = [r for r in runs if met(r)]
    answered_alike = sorted(r["family"] for r in both if no_gain_beyond_constant(r))
    copied_stated = sorted(r["family"] for r in both if not no_gain_beyond_constant(r) and no_gain_where_unstated(r))
    shortcut = lambda r: no_gain_beyond_constant(r) or no_gain_where_unstated(r)  # noqa: E731
    every_met = [r for r in at_defaults if met(r)]
    every_beyond = [r for r in every_met if not shortcut(r)]
    others = [r for r in runs if r["family"] not in answered_alike + copied_stated]
    return {"policy": policy, "setting": None if setting == default else setting, "families": len(runs),
            "both": sorted(r["family"] for r in both),
            "constant_families": answered_alike, "stated_families": copied_stated,
            "mean_diff_without_constant": over("diff", others) if len(others) < len(runs) else None,
            "majority_diff_without_constant": over("majority_diff", others) if len(others) < len(runs) else None,
            "gain": sorted(r["family"] for r in runs if r["diff"][1] > 0),
            "below": sorted(r["family"] for r in runs if r["diff"][0] < 0),
            "empty": sorted(r["family"] for r in runs if r["items"] == 0),
            "spread": (min(r["diff"][0] for r in runs), max(r["diff"][0] for r in runs)),
            "mean_diff": over("diff"), "majority_diff": over("majority_diff"),
            "every_run": {"runs": len(at_defaults), "both": len(every_met), "beyond": len(every_beyond)},
            "best": {"both": sorted({r["family"] for r in every_met}),
                     "beyond": sorted({r["family"] for r in every_beyond})}}


def default_setting() -> tuple[int, int]:
    defaults = arguments().parse_args([])
    return defaults.train, defaults.epochs


def setting_of(r: dict) -> tuple[int, int] | None:
    """A row's (training problems, epochs); None for a row that did not record its epochs (an earlier method)."""
    return (train_of(r), r["epochs"]) if r.get("epochs") is not None else None


def setting_text(setting: tuple[int, int]) -> str:
    """What a setting changed from the defaults, as a command line says it ("--train 48 --epochs 1")."""
    return " ".join(f"--{name} {value}" for name, value, default in zip(COUNTED_APART, setting, default_setting())
                    if value != default)


def family_at(r: dict, setting: tuple[int, int]) -> str | None:
    """A row's family where it ran the method's settings but, perhaps, those counted apart (`COUNTED_APART`), and
    ran `setting` with them ("aiw (--train 48)", two epochs, is aiw at (48, 2)), else None. Its label names what
    differed from the defaults of the day it was archived, so only these flags may appear in it."""
    family, _, changed = r["family"].partition(" (")
    apart = r"(--(train|epochs) \d+ ?)+\)"
    return family if setting_of(r) == setting and (not changed or re.fullmatch(apart, changed)) else None


def train_of(r: dict) -> int:
    """A row's training-set size; rows archived before it was recorded say it in their label, or ran FIRST_TRAIN."""
    said = re.search(r"[( ]--train (\d+)[ )]", r["family"])
    return r.get("train", int(said[1]) if said else FIRST_TRAIN)


def across_lines(rows: list[dict]) -> dict[tuple[int, int] | None, str]:
    """The across-families lines: at the defaults (key None; a line saying none ran there yet, where none did), then
    at each other (training problems, epochs) run, the most problems first."""
    others = sorted({setting_of(r) for r in rows} - {None, default_setting()}, reverse=True)
    summaries = {s: across_families(rows, setting=s) for s in [None, *others]}
    lines = {s: across_text(summary).strip() for s, summary in summaries.items() if summary}
    if None not in lines:
        train, epochs = default_setting()
        lines = {None: f"No family has run at the defaults ({train} training problems, {epochs} "
                       f"epoch{'s' if epochs != 1 else ''}) yet.", **lines}
    return lines


def no_gain_beyond_constant(r: dict) -> bool:
    """Whether a run's gain may be its test split's most common answer alone: where recorded, no gain beyond noise
    on the problems that answer gets wrong; before that (2026-11-27), the most common answer given to every problem
    doing as well as the library, within noise; rows with neither are not suspected."""
    if r.get("diff_where_constant_wrong"):
        return r["diff_where_constant_wrong"][1] <= 0
    return bool(r.get("mean_minus_constant")) and r["mean_minus_constant"][1] <= 0


def across_text(summary: dict) -> str:
    low, high = summary["spread"]
    where = f"at the defaults but {setting_text(summary['setting'])}" if summary.get("setting") else "at the defaults"
    return (f"Across {summary['families']} families, the latest {summary['policy']} row of each {where}: "
            f"{len(summary['both'])} meet both conditions{constant_caveat(summary)}, {len(summary['gain'])} gain beyond noise, "
            f"{len(summary['below'])} below no library, {len(summary['empty'])} kept no item; gains {low:+.3f} to "
            f"{high:+.3f}, their mean {summary['mean_diff']}"
            + (f" ({summary['mean_diff_without_constant']} without "
               f"{', '.join(summary['constant_families'] + summary.get('stated_families', []))})"
               if summary.get("mean_diff_without_constant") else "")
            + f", the votes' mean {summary['majority_diff']}"
            + (f" ({summary['majority_diff_without_constant']} without them)"
               if summary.get("majority_diff_without_constant") else "")
            + "; 95% intervals of the mean over these families, resampling families" + every_run_text(summary) + "\n")


def every_run_text(summary: dict) -> str:
    every, best = summary["every_run"], summary["best"]
    where = f"at {setting_text(summary['setting'])}" if summary.get("setting") else "at the defaults"
    return (f". Every row {where}, reruns included: {every['both']} of {every['runs']} met both conditions, "
            f"{every['beyond']} beyond the most common answer and any answer stated in the problem; by each family's "
            f"best row, {len(best['both'])} of {summary['families']} families met both, {len(best['beyond'])} beyond "
            "them")


def no_gain_where_unstated(r: dict) -> bool:
    """Whether a run's gain may be copying the answer its test problems state ('Calculate the following: 2*x'):
    where some state it and others do not, no gain beyond noise on the others."""
    return bool(r.get("diff_where_unstated")) and r["diff_where_unstated"][1] <= 0


def constant_caveat(summary: dict) -> str:
    found, stated = summary.get("constant_families"), summary.get("stated_families")
    parts = ([f"{', '.join(found)}: no better than its most common answer given every time"] if found else []) + (
        [f"{', '.join(stated)}: no gain where the problem does not state its answer"] if stated else [])
    return f" ({'; '.join(parts)})" if parts else ""


def same(r: dict) -> str:
    """The items cell's tail: a learned arm that is the none arm's version, or how many of its test answers copied a
    worked example shown to them."""
    if r.get("same_as"):
        return f", the {r['same_as']} version: sampled once"
    copied = r.get("copies")
    if not copied:
        return ""
    right = f", right {copied['mean_reward']:.2f}" if copied["mean_reward"] is not None else ""
    return f"; {copied['share']:.0%} of its test answers copy an example ({copied['copied']} of {copied['of']}{right})"


def wall(r: dict) -> str:
    """Minutes, on which CPU, the epochs where not 1, where the time limit cut learning short, and what else shared
    the CPU (`note`, kept in the archive)."""
    return ", ".join(part for part in (f"{r['wall_min']:.0f} min", r.get("cpu"), epochs_text(r), cut_text(r),
                                       r.get("note")) if part)


def cut_text(r: dict) -> str:
    """Where the learning time limit stopped a run before its last step (rows since 2026-11-30 record it)."""
    steps = r.get("learning_steps")
    if not steps or steps["run"] >= steps["planned"] or r.get("learn_minutes") is None:
        return ""
    return f"learning cut by its {r['learn_minutes']:g}-min limit after {steps['run']} of {steps['planned']} steps"


def epochs_text(r: dict) -> str:
    """"2 epochs" where a run learned for other than 1 (rows archived before the field was recorded ran 1)."""
    return f"{r['epochs']} epochs" if r.get("epochs", 1) != 1 else ""


def pruned(r: dict) -> str:
    prune = r.get("prune")
    if prune is None:
        return "nothing to prune" if r["items"] == 0 else "not run"
    text = f"{prune['dropped']} of {prune['items']}"
    if prune["status"] != "promoted":
        return text + " (gate refused)"
    effect = prune.get("test_effect")
    if effect:
        return text + f", {effect['value']:+.3f} [{effect['low']:+.3f}, {effect['high']:+.3f}]"
    return text + (", not tested" if prune["dropped"] else "")


def count_arg(text: str) -> int:
    """A count of 0 or more, refused before anything runs."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a count of 0 or more, not {text!r}")
    return int(text)


def minutes_arg(text: str) -> float | None:
    """Minutes above 0, or `none` for no limit (also as a recorded setting, "None")."""
    if text.lower() == "none":
        return None
    try:
        minutes = float(text)
    except ValueError:
        minutes = 0.0
    if not minutes > 0 or math.isinf(minutes):
        raise argparse.ArgumentTypeError(f"minutes above 0, or `none`, not {text!r}")
    return minutes


def hinted_arg(text: str) -> str:
    if text == "auto" or (text.isdigit() and int(text) <= 16):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: `auto` or a number of answers from 0 to 16")


def hinted_examples(args: argparse.Namespace, calibration: task_levels.Calibration | None) -> int:
    """`--hinted-examples`: a number, or (auto) `HINTED_ANSWERS` where the probe of the level chosen solved under the
    aim's floor. There the model's own answers give next to no worked example: told the answer, the 0.5B reached it
    in 6 of 16 answers on count_bits at level -1, where it reached it in none of 16 untold (a scratch probe, Intel Xeon,
    2026-12-02), though in 0 of 16 on number_sorting at level 0."""
    if args.hinted_examples != "auto":
        return int(args.hinted_examples)
    return HINTED_ANSWERS if solves_almost_nothing(calibration) else 0


def solves_almost_nothing(calibration: task_levels.Calibration | None) -> bool:
    """Whether the probe of the level chosen solved under the aim's floor: the model's own answers will give next to
    no worked example. False where no probe ran (a level given)."""
    rate = calibration.rates.get(calibration.level) if calibration else None
    return rate is not None and rate < calibration.aim.floor


def switched_on(choice: str, calibration: task_levels.Calibration | None) -> bool:
    """`--labeled-examples`, `--examples-as-turns`: on, off, or (auto) on where the model solves almost nothing."""
    return choice == "on" or (choice == "auto" and solves_almost_nothing(calibration))


def level_arg(text: str) -> str:
    if text in ("auto", "default") or (text.lstrip("-").isdigit() and int(text) >= task_levels.MIN_LEVEL):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: `auto`, `default` or a level number ({task_levels.MIN_LEVEL} the "
                                     "easiest; below 0, easier than reasoning-gym's own levels)")


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=DEFAULT_FAMILIES, help="reasoning-gym task names, or `quickstart`")
    parser.add_argument("--train", type=int, default=FIRST_TRAIN, help="training problems")
    parser.add_argument("--val", type=int, default=6)
    parser.add_argument("--test", type=int, default=24)
    parser.add_argument("-k", type=int, default=4, help="samples per test problem")
    parser.add_argument("--val-samples", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2,
                        help="passes over train; 2 since 2026-11-26 (the README's earlier rows ran 1)")
    parser.add_argument("--learn-minutes", type=minutes_arg, default=LEARN_MINUTES,
                        help="start no learning step after this many minutes of learning (the one under way "
                             "finishes; the prune step still runs), or `none`; 30 since 2026-11-30, none before")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--examples", type=int, default=2, help="worked examples per prompt (0: lessons only)")
    parser.add_argument("--examples-per-answer", type=int, default=None,
                        help="keep at most N worked examples with the same final answer (default: no limit)")
    parser.add_argument("--refuse-copied-examples", action="store_true",
                        help="keep no answer that copies a worked example's solution as another worked example")
    parser.add_argument("--refuse-answer-in-problem", action="store_true",
                        help="keep no worked example of a problem whose answer stands in its own statement (a "
                             "palindrome to spell backward), unless most problems are like that")
    parser.add_argument("--retrieve-lessons", type=int, default=None)
    parser.add_argument("--learner-examples", type=int, default=0,
                        help="where no answer of the policy is fit to show, the learner's answers (this many) can be "
                             "the worked example")
    parser.add_argument("--hinted-examples", type=hinted_arg, default="0",
                        help="where no answer of the policy is fit to show, its answers told the reference answer "
                             "(this many) can be the worked example; auto: 2 where the level chosen was solved under "
                             "the aim's floor in its probe (the model solves almost nothing), else 0; off by "
                             "default: one of five runs met the target (benchmarks/results/draw-76.md)")
    parser.add_argument("--labeled-examples", choices=("auto", "on", "off"), default="auto",
                        help="where still no answer is fit to show, the problem's reference answer alone (no working) "
                             "can be the worked example; auto (the default): on where the level chosen was solved "
                             "under the aim's floor in its probe")
    parser.add_argument("--examples-as-turns", choices=("auto", "on", "off"), default="auto",
                        help="show worked examples as earlier turns of the chat, not as system-message text; auto (the "
                             "default): on where the level chosen was solved under the aim's floor in its probe")
    parser.add_argument("--summarize", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--hard-groups", default="skip")
    parser.add_argument("--prune", action=argparse.BooleanOptionalAction, default=True,
                        help="end the run with the prune step (each item left out on validation; lessons that "
                             "showed no help dropped)")
    parser.add_argument("--test-unpruned", action=argparse.BooleanOptionalAction, default=False,
                        help="where the prune step dropped items, also test the library before it (one more test "
                             "arm, as long as the others: 12 min for coin_flip on 2 cores; the default until "
                             "2026-11-26)")
    parser.add_argument("--test-examples", type=count_arg, default=None, metavar="N",
                        help="also test the learned library shown N worked examples per prompt (its budget scaled "
                             "alike): one more test arm, compared with the learned one on the same problems and seeds")
    parser.add_argument("--test-first", type=count_arg, default=None, metavar="N",
                        help="also test the learned library cut to the items learned from the first N training "
                             "problems: with --train above N, what more training problems bought, on the same test "
                             "problems and seeds")
    parser.add_argument("--test-epochs", action="store_true",
                        help="also test the library the run held after each epoch but the last (with --epochs above "
                             "1): what the later epochs bought, on the same test problems and seeds")
    parser.add_argument("--python-tool", action="store_true",
                        help="the policy may write a Python program; it is run and the model answers again after "
                             "seeing what it printed (gym_tf.python_tool), in every arm alike")
    parser.add_argument("--max-completion-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--level", default="auto", type=level_arg,
                        help="reasoning-gym difficulty: `auto` (probe level 0, then 1, 2, ... or -1, -2 and take the "
                             "one solved nearest the aim), `default` (the generator's own settings), or a level number "
                             "(below 0: easier than reasoning-gym's level 0, see gym_tf/task_levels.py)")
    parser.add_argument("--level-aim", choices=AIMS, default="band",
                        help="with --level auto, where to aim (`half`: the rule of the runs before 2026-11-24): "
                             + "; ".join(f"`{name}` the level solved nearest {a.target}, climbing past levels solved "
                                         f"more than {a.ceiling}"
                                         + (f", below level 0 past one solved less than {a.floor}" if a.floor else "")
                                         + f", {a.problems} probe problems"
                                         for name, a in AIMS.items()))
    parser.add_argument("--base-url")
    parser.add_argument("--model")
    parser.add_argument("--model-file", help="a local GGUF as the policy (embedded engine), e.g. a larger model")
    parser.add_argument("--api-key")
    parser.add_argument("--learner-base-url", help="a different server for the learning stages")
    parser.add_argument("--learner-model")
    parser.add_argument("--learner-model-file", help="a local GGUF for the learning stages (embedded engine)")
    parser.add_argument("--out", type=Path, default=Path("learning-effect"))
    parser.add_argument("--resume", action="store_true",
                        help="go on with a stopped run: the same arguments and --out; families already compared are "
                             "read back, a family's level and optimize run are taken up where they stopped (a test "
                             "split cut short is sampled again)")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="print the table of runs already made, run nothing: their comparison.json files, or "
                             "results.json lists (a run's, or the archive benchmarks/results/learning_effect.json)")
    parser.add_argument("--screen", action="store_true",
                        help="run nothing but a screen of --families: each one's easiest level, "
                             f"{SCREEN_PROBLEMS} problems x 2 answers, no library (solved, mean reward, answers cut at "
                             "the token cap), to choose families the model can learn from")
    parser.add_argument("--archive", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: add finished runs (their results.json, or a family's comparison.json, "
                             "whose row is made again under today's defaults) to benchmarks/results/"
                             "learning_effect.json and the README's table and across-families line")
    parser.add_argument("--note", help="with --archive: what else shared the CPU, for the wall column")
    parser.add_argument("--plot", type=Path,
                        help="with --report: each run's intervals against no library and its vote, as a PNG")
    return parser


def main() -> None:
    parser = arguments()
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
