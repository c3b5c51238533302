"""Generated task families (reasoning-gym) at a difficulty the model can learn from.

The method learns from groups with mixed rewards: a family where the frozen model solves nothing gives no verified
answer to copy and no contrast to learn from. reasoning-gym describes each family's difficulty as a curriculum of
levels (level 0 the easiest; level L draws problems from levels 0 to L). `calibrate` probes a model on a few problems
per level, from level 0 up, climbing past levels solved too often, and picks the probed level whose solve rate
(answers fully right) is nearest its `Aim`. The probe problems come from their own generator seed, and `split`
leaves out every problem the probes showed.

Below level 0 (`MIN_LEVEL` to -1) the problems are easier than any of reasoning-gym's: each attribute of the
curriculum steps from its level-0 value away from its level-1 value, by the square root of their ratio per level
(number_sorting's 10 to 100 numbers become 3 to 32 at level -1 and 1 to 10 at level -2; largest_island's 5 x 5 grid
2 x 2, then 1 x 1). An attribute stays at level 0's where the generator refuses its new value (jugs needs three
jugs) or makes no problems with it in `TRIAL_SECONDS` (puzzle24's numbers 1 to 2 never make 24).
`AIM` descends there when level 0 is solved less often than its `floor`, 0.05 (at most 1 of its 32 probe answers
right): of 16 families drawn at random on 2026-12-01, the 0.5B solved none at level 0, so the method had no verified
answer and no mixed group to learn from. The floor stays below 0.06, the probe of aiw and fraction_simplification at
level 0, where both gained. On a level it can descend from, the probe reads its first `first_look` problems first, and
past them only where one of their answers was right.

Where to aim was measured, not derived. The first aim was one half, where a group of G answers is most often mixed
(`FIRST_AIM`). In the benchmark's 12 runs on clean splits, the library gained beyond noise in every run whose
no-library Mean@4 on the test split lay between 0.18 and 0.46 (5 of 5) and in none outside (0 of 7); above the
band, the model's own vote already answered most problems. The probes that put a run in the band read 0.19; the
ones above it 0.44 to 0.81. `AIM` takes the level nearest 0.3 and climbs only past levels solved more than 0.45 of
the time, with twice the probe problems, since 8 problems x 2 samples read 0.44 on a level whose test split came out
at 0.67. It put both families rerun with it into the band (no-library 0.34 and 0.44), and neither gained beyond
noise: the band now holds 5 of 7, so AIM chooses where the benchmark measures; it is not shown to raise the gain.

Splits are drawn from one generator stream and are disjoint by problem text. reasoning-gym seeds item i of a dataset
with `seed + i`, so datasets made with neighbouring seeds are the same problems shifted by one: the benchmark's first
splits (seeds s, s+1, s+2) shared 14 of 24 test problems and all 6 validation problems with the training set.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from gym_tf.backends import Backend, Sampling
from gym_tf.datasets import load_dataset
from gym_tf.errors import ConfigError
from gym_tf.evaluate import evaluate

REWARD = "rewards.reasoning_gym:score"
# the answer column of a problem whose grader checks an answer's validity (graph_color, rubiks_cube, ...): the learner
# reads it as the reference answer, which was the word "None"
NO_SINGLE_ANSWER = "any answer the grader accepts (this problem has no single answer)"


@dataclass(frozen=True)
class Aim:
    """Probe past levels solved more often than `ceiling` (up) or less often than `floor` (down from level 0); take
    the probed level solved nearest `target`."""

    target: float
    ceiling: float
    problems: int  # probe problems per level (2 samples each)
    max_probes: int
    floor: float = 0.0  # 0: never below level 0 (the rule of the runs before 2026-12-02)
    # probe problems answered first on a level it could descend from; none of their answers right, it descends
    # without the rest (0: every level probed in full, the rule of the runs to number_sorting seed 79)
    first_look: int = 0


# first_look 8: a level the 0.5B solves almost never costs half a probe (the probes of number_sorting seed 77 took
# 15.5 min of its 87 on an AVX2 EPYC, most answers cut at the 256-token cap). It descends where the full probe would
# have stayed only if none of the first 16 answers and at least 2 of the other 16 were right: at a solve rate of 0.1,
# 9 times in 100; the answers it does read are the same (seeds follow the problem, not the batch)
AIM = Aim(target=0.3, ceiling=0.45, problems=16, max_probes=6, floor=0.05, first_look=8)
FIRST_AIM = Aim(target=0.5, ceiling=0.8, problems=8, max_probes=4)  # the rule of the benchmark's runs to 2026-11-24
MIN_LEVEL = -2


# sokoban's generator ran past 10 minutes on 62 problems at level 0 (2-core AMD EPYC): a family that slow is reported
# as one that could not be made, and the benchmark goes on with the next
GENERATION_MINUTES = 10.0


def has_levels(family: str) -> bool:
    from reasoning_gym.factory import has_curriculum

    return has_curriculum(family)


def max_level(family: str) -> int:
    from reasoning_gym.factory import create_curriculum

    return max(len(a.levels) for a in create_curriculum(family).attributes.values()) - 1


def level_config(family: str, level: int) -> dict[str, Any]:
    """The generator's settings at `level` (every attribute at that level, or its highest); below 0, easier than
    level 0 (`easier_config`)."""
    from reasoning_gym.factory import create_curriculum

    if level < MIN_LEVEL:
        raise ValueError(f"level must be {MIN_LEVEL} or more, not {level}")
    curriculum = create_curriculum(family)
    curriculum.set_global_level(max(level, 0))
    config = {k: v for k, v in vars(curriculum.generate_configuration({})).items() if k not in ("seed", "size")}
    return easier_config(family, curriculum, config, -level) if level < 0 else config


def easier_config(family: str, curriculum: Any, config: dict[str, Any], depth: int) -> dict[str, Any]:
    """Level 0's `config` made `depth` steps easier: each attribute's fields scaled by (level 0 / level 1) ** (depth
    / 2), the direction its curriculum grows in, reversed. A field the generator refuses at its new value (its
    config's own checks, or no problems made in `TRIAL_SECONDS`, tried on a few) keeps level 0's."""
    easier = dict(config)
    for attribute in curriculum.attributes.values():
        first, second = attribute.levels[:2]
        fields = [getattr(attribute, name, None) for name in ("lower_field_name", "upper_field_name", "field_name")]
        trial = {**easier, **{f: stepped(easier[f], first, second, depth) for f in fields if f in easier}}
        if trial != easier and generates(family, trial):
            easier = trial
    return easier


# puzzle24 draws four numbers until they make 24 and never stops where they cannot: its level -1 (numbers 1 to 2)
# held the benchmark's probe for 17 minutes before it was stopped (2026-12-07). A trial runs in a child process, and
# one that makes no problems in this time is refused like a value the generator rejects. Its own limit, far under
# GENERATION_MINUTES: it makes 4 problems, where sokoban's slow generator took about 10 s a problem.
TRIAL_SECONDS = 60.0
_TRIAL = """
import pickle, sys
import reasoning_gym
family, config = pickle.load(sys.stdin.buffer)
list(reasoning_gym.create_dataset(family, size=4, seed=0, **config))
"""


def generates(family: str, config: dict[str, Any]) -> bool:
    """Whether reasoning-gym makes a few problems of `family` with `config` in `TRIAL_SECONDS`: a child process, so
    a generator that loops without end is stopped; its errors are its refusal of a value, of any type. Asked once
    per process: a probe reads each level's settings several times."""
    return _generates(pickle.dumps((family, config)))


@lru_cache(maxsize=None)
def _generates(trial: bytes) -> bool:
    try:
        child = subprocess.run([sys.executable, "-P", "-c", _TRIAL], input=trial, capture_output=True,
                               timeout=TRIAL_SECONDS)
    except subprocess.TimeoutExpired:
        return False
    return child.returncode == 0


def stepped(value: Any, first: Any, second: Any, depth: int) -> Any:
    """`value` scaled by (first / second) ** (depth / 2); an int stays an int and keeps its sign (3 jugs, not 0).
    Values that are not numbers, or levels that do not scale (a sign change, a zero level 1) stay as they are."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (value, first, second))
    if not numbers or second == 0 or first == second or first / second < 0:
        return value
    scaled = value * (first / second) ** (depth / 2)
    if isinstance(value, float):
        return scaled
    return round(scaled) or (1 if value > 0 else -1 if value < 0 else 0)


class GenerationError(RuntimeError):
    """reasoning-gym could not make a family's problems (an unknown family, a generator that failed, a grader that
    fails its own answers)."""


def rows(family: str, size: int, seed: int, level: int | None = None) -> list[dict[str, str]]:
    """`size` problems of `family` (its default settings when `level` is None), with what its grader needs.

    Made with Python's string hashing fixed (PYTHONHASHSEED=0), in a child process when this one hashes at random:
    some generators draw from sets, whose order follows the process's hash seed (isomorphic_strings picks
    `rng.choice(list(letters - used))`), so one seed made other problems in every process, and a benchmark resumed
    with `--resume` found its training set changed."""
    made = _in_child(family, size, seed, level) if sys.flags.hash_randomization else _made(family, size, seed, level)
    return [{"id": f"{family}-{seed}-{i}", "problem": problem, "answer": answer, "rg_task": family, "rg_entry": entry,
             "rg_config": settings} for i, (problem, answer, entry, settings) in enumerate(made)]


def _made(family: str, size: int, seed: int, level: int | None) -> list[list[str]]:
    """Each problem's question, answer, entry and settings (what its grader reads, and is built with), as text. A
    problem the generator fails to make is left out (countdown gives up on 1 seed in a few hundred: "Failed to
    generate valid expression after 100 attempts"), and so is one whose grader does not give its own answer full
    marks once the entry is stored (no answer of the model could be graded right), and one whose grader gives full
    marks to text that answers nothing (every answer would be graded right); a family with no other problem is refused
    here, before anything is sampled."""
    import reasoning_gym

    from rewards.reasoning_gym import accepts_anything, entry_text, read_entry, reference_grade, settings_text

    try:
        settings = level_config(family, level) if level is not None else {}
        graded_by = settings_text(family, settings)
        generated = made_apart(family, reasoning_gym.create_dataset(family, size=size, seed=seed, **settings))
        made = [[e["question"], NO_SINGLE_ANSWER if e["answer"] is None else str(e["answer"]), entry_text(e),
                 graded_by] for e in generated]
        entries = [read_entry(text) for _, _, text, _ in made]
        grades = [reference_grade(family, entry, graded_by) for entry in entries]
        lenient = {i for i, entry in enumerate(entries) if accepts_anything(family, entry, graded_by)}
    except Exception as error:
        raise GenerationError(f"reasoning-gym could not make {family} problems: {type(error).__name__}: "
                              f"{error}") from error
    failed = {i for i, grade in enumerate(grades) if grade is not None and grade < 1}
    if made and len(failed) == len(made):
        first = min(failed)
        raise GenerationError(f"reasoning-gym could not make {family} problems gym-tf can grade: its grader "
                              f"gives problem {first}'s own answer {made[first][1][:40]!r} {grades[first]:.2f}")
    if made and len(lenient | failed) == len(made) and lenient:
        raise GenerationError(f"reasoning-gym's {family} grader gives full marks to any answer "
                              f"({len(lenient)} of {len(made)} problems): it cannot tell a right answer from a wrong one")
    if failed:
        print(f"{family}: {len(failed)} of {len(made)} problems left out: the grader gives their own answers less "
              "than full marks", file=sys.stderr)
    if lenient:
        print(f"{family}: {len(lenient)} of {len(made)} problems left out: the grader gives full marks to any answer",
              file=sys.stderr)
    return [row for i, row in enumerate(made) if i not in failed | lenient]


def made_apart(family: str, dataset: Any) -> list[dict[str, Any]]:
    """Each of a reasoning-gym dataset's problems that its generator makes: one that raises is left out (with a line
    on stderr saying how many), the first error raised again where it made none."""
    made, failed = [], []
    for index in range(len(dataset)):
        try:
            made.append(dataset[index])
        except Exception as error:  # noqa: BLE001  one seed the generator gives up on is not the family
            failed.append(error)
    if failed and not made:
        raise failed[0]
    if failed:
        print(f"{family}: {len(failed)} of {len(dataset)} problems left out: the generator could not make them "
              f"({type(failed[0]).__name__}: {failed[0]})", file=sys.stderr)
    return made


# The child's stdout is its reply: what a generator prints (codeio does) goes to stderr. -P: the gym_tf of PYTHONPATH,
# not one in the working directory.
_CHILD = """
import json, sys
from gym_tf.task_levels import GenerationError, _made
reply, sys.stdout = sys.stdout, sys.stderr
try:
    json.dump(_made(*json.loads(sys.argv[1])), reply)
except GenerationError as error:
    sys.exit(str(error))
"""


def _in_child(family: str, size: int, seed: int, level: int | None) -> list[list[str]]:
    package_root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONIOENCODING": "utf-8",
           "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    try:
        child = subprocess.run([sys.executable, "-P", "-c", _CHILD, json.dumps([family, size, seed, level])],
                               capture_output=True, text=True, encoding="utf-8", errors="replace", env=env,
                               timeout=GENERATION_MINUTES * 60)
    except subprocess.TimeoutExpired as late:
        raise GenerationError(f"reasoning-gym could not make {size} {family} problems in {GENERATION_MINUTES:g} "
                              "min (some generators solve each puzzle they make)") from late
    sys.stderr.write(child.stderr)
    if child.returncode:
        last = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
        raise GenerationError(last if last.startswith("reasoning-gym could not") else
                              f"reasoning-gym could not make {family} problems in a child process: {last}")
    return json.loads(child.stdout)


def check_settings_carried(family: str, level: int | None, rows: list[dict[str, str]]) -> None:
    """Refuse rows written before each carried its generator's settings (`rg_config`, 2026-12-07) where `level`'s
    settings are not the family's defaults: their grader would be the defaults' (time_intervals' partial credit 1440
    times too generous at level 0), and a run resumed on them would grade as the run before the fix did."""
    from rewards.reasoning_gym import settings_text

    if level is None or all("rg_config" in row for row in rows):
        return
    if settings_text(family, level_config(family, level)) != "{}":
        raise ConfigError(f"{family} problems at level {level} were written before rows carried the settings they "
                          "were made with, so their grader would be the family's defaults': run again without --resume")


def write(family: str, size: int, seed: int, path: Path, level: int | None = None) -> None:
    write_rows(rows(family, size, seed, level), path)


def write_rows(problems: list[dict[str, str]], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in problems), encoding="utf-8")


def split(family: str, sizes: dict[str, int], seed: int, level: int | None = None,
          avoid: frozenset[str] = frozenset(), draws: int = 8) -> dict[str, list[dict[str, str]]]:
    """Disjoint splits (e.g. train, val, test, in that order) from one generator stream: each problem text appears
    once in all of them, and never one of `avoid`. Up to `draws` times the problems needed are generated; a family
    or level with fewer distinct problems is a ConfigError naming how many it has."""
    if not sizes or min(sizes.values()) < 1:
        raise ConfigError(f"splits {sizes}: every split needs at least one problem")
    need = sum(sizes.values())
    seen, distinct = set(avoid), []
    for row in rows(family, need * draws, seed, level):
        if row["problem"] not in seen:
            seen.add(row["problem"])
            distinct.append(row)
            if len(distinct) == need:
                break
    else:
        raise ConfigError(f"{family} at level {'default' if level is None else level}: {len(distinct)} distinct "
                          f"problems in {need * draws} drawn, {need} needed: ask for fewer or a harder level")
    out, start = {}, 0
    for name, size in sizes.items():
        out[name], start = distinct[start:start + size], start + size
    return out


def choose(rates: dict[int, float], aim: Aim = AIM) -> int:
    """The probed level whose solve rate is nearest the aim; on a tie the easier one (more answers to copy)."""
    return min(rates, key=lambda level: (round(abs(rates[level] - aim.target), 9), level))


def next_level(level: int, rate: float, top: int, aim: Aim = AIM) -> int | None:
    """The level to probe after `level` read `rate`: a harder one past a level solved too often (from level 0 up),
    an easier one past a level solved too rarely (from level 0 down), else none: choose."""
    if rate > aim.ceiling and 0 <= level < top:
        return level + 1
    if rate < aim.floor and MIN_LEVEL < level <= 0:
        return level - 1
    return None


@dataclass
class Calibration:
    level: int
    rates: dict[int, float]  # every probed level's solve rate
    tokens: int  # prompt and completion tokens the probes spent
    aim: Aim
    too_few: tuple[int, ...] = ()  # levels passed over unprobed: too few distinct problems for the splits


def has_problems(family: str, level: int, needed: int, seed: int) -> bool:
    """Whether the family's generator at `level` makes `needed` distinct problems (as `split` draws them)."""
    try:
        split(family, {"all": needed}, seed, level)
    except ConfigError:
        return False
    return True


async def calibrate(backend: Backend, family: str, seed: int, sampling: Sampling, folder: Path, aim: Aim = AIM,
                    samples: int = 2, on_probe: Callable[[int, float], None] | None = None,
                    needed: int = 0) -> Calibration:
    """Probe level 0, then up past levels solved too often or down past levels solved too rarely (`next_level`; no
    library, `aim.problems` x `samples` each; on a level it can descend from, the first `aim.first_look` problems,
    then the rest only if one of their answers was right), at most `aim.max_probes` levels, and choose. With
    `needed` (the splits' problems), a level whose generator cannot make that many distinct problems besides the
    probe's is passed over unprobed, and so is a level it fails at: the next one the same way is tried. coin_flip's
    level 0 has 8 problems, and a run that chose it stopped at its splits after paying for the probe."""
    from rewards import load_reward

    reward = load_reward(REWARD)
    top = max_level(family)
    rates: dict[int, float] = {}
    too_few: list[int] = []
    tokens = 0
    unmade: GenerationError | None = None
    level: int | None = 0
    step = 1  # the way past a level passed over: up from level 0, on down once descending
    while level is not None and MIN_LEVEL <= level <= top and len(rates) < aim.max_probes:
        path = folder / f"probe-level{level}.jsonl"
        try:
            if level < 0 and level_config(family, level) == level_config(family, level + 1):
                level += step  # chain_sum's level -1 is its level 0 (two terms either way): nothing new to probe
                continue
            if needed and not has_problems(family, level, needed + aim.problems, seed):
                too_few.append(level)
                level += step
                continue
            write(family, aim.problems, seed, path, level)
        except GenerationError as error:  # a level the generator fails at: the others may work, probes stay paid for
            print(f"{family}: level {level} passed over: {error}", file=sys.stderr)
            unmade = error
            level += step
            continue
        problems = load_dataset(str(path))
        descends = aim.floor > 0 and MIN_LEVEL < level <= 0
        parts = [problems[:aim.first_look], problems[aim.first_look:]] if descends and aim.first_look else [problems]
        answers: list[float] = []
        for part in filter(None, parts):
            report = await evaluate(backend, part, reward, samples, sampling, seed=seed)
            # fully right answers only: a worked example needs one, and partial credit (gcd's grader gives some to
            # any number) made a level look learnable where no answer was right
            answers += [r.reward or 0.0 for group in report.rollouts.values() for r in group]
            tokens += report.prompt_tokens + report.completion_tokens
            if not any(a >= 1.0 for a in answers):
                break  # a first look with none right: on down (a whole probe has a single part)
        rates[level] = sum(a >= 1.0 for a in answers) / len(answers)
        if on_probe:
            on_probe(level, rates[level])
        following = next_level(level, rates[level], top, aim)
        step = -1 if following is not None and following < level else step
        level = following
    if not rates and unmade:
        raise unmade
    if not rates:
        raise ConfigError(f"{family}: no level from 0 to {top} makes {needed} distinct problems for the splits "
                          f"besides the probe's {aim.problems}: ask for fewer")
    return Calibration(choose(rates, aim), rates, tokens, aim, tuple(too_few))
