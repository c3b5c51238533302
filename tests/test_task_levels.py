"""Generated task families at a learnable difficulty: reasoning-gym's levels, and the probe that picks one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from gym_tf import task_levels
from gym_tf.backends import Choice, Generation, Sampling

pytest.importorskip("reasoning_gym")


def terms(problem: str) -> int:
    return len(re.findall(r"\d+", problem.split(":")[-1]))


@pytest.mark.parametrize("rates, aim, level", [
    ({0: 1.0, 1: 0.9, 2: 0.6}, task_levels.FIRST_AIM, 2),
    ({0: 1.0, 1: 0.55, 2: 0.45}, task_levels.FIRST_AIM, 1),  # the same distance from one half: the easier level
    ({0: 0.9, 1: 0.1}, task_levels.FIRST_AIM, 0),
    ({0: 0.0}, task_levels.FIRST_AIM, 0),
    ({0: 0.62, 1: 0.44}, task_levels.FIRST_AIM, 1),
    ({0: 0.62, 1: 0.44, 2: 0.25}, task_levels.AIM, 2),  # nearest 0.3
    ({0: 0.9, 1: 0.5, 2: 0.15}, task_levels.AIM, 2),  # 0.15 is nearer 0.3 than 0.5 is
    ({0: 0.19}, task_levels.AIM, 0),
    ({0: 0.35, 1: 0.25}, task_levels.AIM, 0),  # the same distance: the easier level
])
def test_the_level_solved_nearest_the_aim_is_chosen(rates, aim, level):
    assert task_levels.choose(rates, aim) == level


@pytest.mark.parametrize("level, rate, top, aim, following", [
    (0, 0.9, 5, task_levels.FIRST_AIM, 1),
    (1, 0.8, 5, task_levels.FIRST_AIM, None),  # at the ceiling: learnable
    (0, 0.3, 5, task_levels.FIRST_AIM, None),
    (1, 1.0, 1, task_levels.FIRST_AIM, None),  # no harder level exists
    (0, 0.62, 5, task_levels.FIRST_AIM, None),
    (0, 0.62, 5, task_levels.AIM, 1),  # above the band's ceiling
    (1, 0.44, 5, task_levels.AIM, None),
    (1, 0.5, 5, task_levels.AIM, 2),
    (0, 0.0, 5, task_levels.FIRST_AIM, None),  # the rule before levels below 0: level 0 is the easiest
    (0, 0.0, 5, task_levels.AIM, -1),  # solved too rarely: an easier level
    (-1, 0.03, 5, task_levels.AIM, -2),
    (-1, 0.1, 5, task_levels.AIM, None),
    (-2, 0.0, 5, task_levels.AIM, None),  # no easier level exists
    (0, 0.06, 5, task_levels.AIM, None),  # aiw and fraction_simplification probed 0.06 at level 0 and gained there
    (-1, 0.9, 5, task_levels.AIM, None),  # never back up past the level 0 it came down from
    (2, 0.0, 5, task_levels.AIM, None),  # never down past the level 1 it climbed from
])
def test_probing_climbs_past_levels_solved_too_often_and_descends_past_level_0_solved_too_rarely(
        level, rate, top, aim, following):
    assert task_levels.next_level(level, rate, top, aim) == following


def numbers(row: dict) -> int:
    """How many numbers a number_sorting problem sorts, as its generator recorded it."""
    return json.loads(row["rg_entry"])["metadata"]["numbers"]


def test_levels_below_0_are_easier_than_the_curriculum_and_their_problems_follow_them():
    """number_sorting's level 0 sorts 10 to 100 numbers; the 0.5B sorted none of 16 such lists (2026-12-01)."""
    level0, below1, below2 = (task_levels.level_config("number_sorting", n) for n in (0, -1, -2))
    assert (level0["min_numbers"], level0["max_numbers"]) == (10, 100)
    assert (below1["min_numbers"], below1["max_numbers"]) == (3, 32)  # 10 and 100 x sqrt(10 / 100)
    assert (below2["min_numbers"], below2["max_numbers"]) == (1, 10)
    assert below2["max_value"] < below1["max_value"] < level0["max_value"]
    assert below1["max_decimals"] == level0["max_decimals"] == 1  # 1 x (0 / 1) ** 0.5 is 0: an int not 0 stays 1 or more
    assert max(numbers(r) for r in task_levels.rows("number_sorting", 12, 5, -2)) <= 10
    assert min(numbers(r) for r in task_levels.rows("number_sorting", 12, 5, 0)) >= 10
    # a value the generator refuses keeps level 0's: jugs asserts more than 2 jugs, and 3 x sqrt(3 / 4) rounds to 3
    # anyway at level -1, but to 2 (refused) at level -2
    assert task_levels.level_config("jugs", -2)["num_jugs"] == task_levels.level_config("jugs", 0)["num_jugs"] == 3
    assert task_levels.level_config("jugs", -2)["difficulty"] < task_levels.level_config("jugs", 0)["difficulty"]
    with pytest.raises(ValueError, match="level must be -2 or more"):
        task_levels.level_config("number_sorting", -3)


def test_a_generator_that_never_ends_below_level_0_keeps_level_0s_value(monkeypatch):
    """puzzle24 draws numbers until four of them make 24: at level -1 (numbers 1 to 2) none can, and its generator
    looped without end inside the benchmark's probe (2026-12-07). The trial of that value now stops at its limit and
    the value is refused: level -1 is level 0, which the probe then passes over as nothing new."""
    import threading

    monkeypatch.setattr(task_levels, "TRIAL_SECONDS", 5.0)
    found = {}
    trying = threading.Thread(target=lambda: found.update(config=task_levels.level_config("puzzle24", -1)),
                              daemon=True)  # without the limit it never returns: the test fails, not hangs
    trying.start()
    trying.join(timeout=60)
    assert not trying.is_alive(), "level_config('puzzle24', -1) ran past 60 s"
    level0 = task_levels.level_config("puzzle24", 0)
    assert found["config"] == level0 and (level0["min_value"], level0["max_value"]) == (1, 5)
    assert task_levels.generates("puzzle24", level0)
    assert not task_levels.generates("puzzle24", {**level0, "max_value": 2})


@pytest.mark.parametrize("value, first, second, depth, easier", [
    (10, 10, 100, 2, 1),
    (100, 10, 100, 1, 32),
    (0.5, 0.5, 0.25, 2, 1.0),  # binary_matrix's p_zero falls as it gets harder: easier is more zeros
    (-100, -100, -500, 2, -20),
    (1, 2, 5, 2, 1),  # an int never rounds to 0: 1 x 0.4 is 0.4, still one island
    (-1, -2, -5, 2, -1),
    (0, 0, 1, 1, 0),
    (5, 5, 5, 1, 5),  # a level that does not change
    (3, -1, 1, 1, 3),  # a sign change: no scale
    (("+",), ("+",), ("+", "-"), 1, ("+",)),
])
def test_a_value_steps_below_level_0_by_the_ratio_of_levels_0_and_1(value, first, second, depth, easier):
    assert task_levels.stepped(value, first, second, depth) == easier


def test_a_level_sets_the_generator_and_its_problems_follow_it():
    easiest = task_levels.level_config("chain_sum", 0)
    harder = task_levels.level_config("chain_sum", 3)
    assert (easiest["max_terms"], easiest["max_digits"]) == (2, 1)
    assert harder["max_terms"] > easiest["max_terms"] and harder["max_digits"] > easiest["max_digits"]
    assert {terms(r["problem"]) for r in task_levels.rows("chain_sum", 12, 5, 0)} == {2}
    assert max(terms(r["problem"]) for r in task_levels.rows("chain_sum", 40, 5, 3)) > 2
    # no level: the generator's own settings, as the benchmark's earlier rows used
    assert task_levels.rows("chain_sum", 3, 5) == task_levels.rows("chain_sum", 3, 5, None)
    assert task_levels.rows("chain_sum", 3, 5) != task_levels.rows("chain_sum", 3, 5, 0)


class TermCounter:
    """Right exactly on problems of at most `reach` terms: its solve rate falls as the level rises."""

    model = "term-counter"

    def __init__(self, answers: dict[str, str], reach: int):
        self.answers, self.reach, self.problems = answers, reach, []

    async def generate(self, messages, n=1, **sampling) -> Generation:
        problem = messages[-1]["content"]
        self.problems.append(problem)
        answer = self.answers[problem] if terms(problem) <= self.reach else "wrong"
        return Generation([Choice(text=f"\\boxed{{{answer}}}", finish_reason="stop", completion_tokens=3)] * n,
                          10 * n, 3 * n, 0.0)

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("aim", [task_levels.AIM, task_levels.FIRST_AIM], ids=["band", "half"])
async def test_calibration_probes_upward_and_stops_at_the_first_level_not_solved_too_often(tmp_path, aim):
    seed = 11
    answers = {r["problem"]: r["answer"] for level in range(6)
               for r in task_levels.rows("chain_sum", aim.problems, seed, level)}
    backend = TermCounter(answers, reach=3)
    seen = []
    result = await task_levels.calibrate(backend, "chain_sum", seed, Sampling(max_tokens=32), tmp_path, aim,
                                         on_probe=lambda level, rate: seen.append((level, rate)))
    # the fake's true rate per level, from the problems the probe wrote
    truth = {}
    for level in result.rates:
        written = (tmp_path / f"probe-level{level}.jsonl").read_text().splitlines()
        problems = [json.loads(line)["problem"] for line in written]
        assert len(problems) == aim.problems
        truth[level] = sum(terms(p) <= 3 for p in problems) / len(problems)
    assert result.rates == truth
    assert seen == list(result.rates.items())
    assert truth[0] == truth[1] == 1.0  # two and three terms: too easy, so it climbed
    last = max(result.rates)
    assert result.rates[last] <= aim.ceiling
    assert all(rate > aim.ceiling for level, rate in result.rates.items() if level < last)
    assert result.level == task_levels.choose(result.rates, aim) and result.rates[result.level] < 1.0
    assert result.aim == aim
    assert result.tokens == 13 * 2 * aim.problems * len(result.rates)  # 2 samples per problem, 10 + 3 tokens each
    assert len(backend.problems) == aim.problems * len(result.rates)  # one call per problem (n = 2)


def test_the_band_aims_at_harder_levels_than_half_on_the_same_probes():
    """The measured reason for AIM: a probe read of 0.44 to 0.81 put runs above the band, 0.19 inside it."""
    for rates in ({0: 0.62, 1: 0.19}, {0: 0.94, 1: 0.69, 2: 0.25}, {0: 0.81, 1: 0.69, 2: 0.31}):
        assert task_levels.choose(rates, task_levels.AIM) > task_levels.choose(rates, task_levels.FIRST_AIM)
    assert task_levels.choose({0: 0.19}, task_levels.AIM) == task_levels.choose({0: 0.19}, task_levels.FIRST_AIM)


async def test_calibration_stops_after_its_probe_budget(tmp_path):
    seed = 11
    answers = {r["problem"]: r["answer"] for level in range(6) for r in task_levels.rows("chain_sum", 8, seed, level)}
    budget = task_levels.Aim(target=0.5, ceiling=0.8, problems=8, max_probes=3)
    result = await task_levels.calibrate(TermCounter(answers, reach=99), "chain_sum", seed, Sampling(max_tokens=32),
                                         tmp_path, budget)
    assert result.rates == {0: 1.0, 1: 1.0, 2: 1.0} and result.level == 0


def half_credit(completions, **_):
    """A grader's partial credit for every answer: none of them right."""
    return [0.5 for _ in completions]


async def test_partial_credit_is_not_counted_as_solved(tmp_path, monkeypatch):
    monkeypatch.setattr(task_levels, "REWARD", "test_task_levels:half_credit")
    answers = {r["problem"]: r["answer"] for level in range(-2, 6)
               for r in task_levels.rows("chain_sum", task_levels.AIM.problems, 11, level)}
    result = await task_levels.calibrate(TermCounter(answers, reach=99), "chain_sum", 11, Sampling(max_tokens=32),
                                         tmp_path)
    # mean reward 0.5, yet no answer was fully right: down to level -2 (-1 is chain_sum's level 0), the easier of
    # two levels as far from the aim
    assert result.rates == {0: 0.0, -2: 0.0} and result.level == -2


class NumberCounter:
    """Sorts right exactly the number_sorting problems of at most `reach` numbers."""

    model = "number-counter"

    def __init__(self, rows: list[dict], reach: int):
        self.rows, self.reach = {r["problem"]: r for r in rows}, reach
        self.asked: list[str] = []  # every problem asked, once per answer

    async def generate(self, messages, n=1, **sampling) -> Generation:
        row = self.rows[messages[-1]["content"]]
        self.asked += [row["problem"]] * n
        answer = row["answer"] if numbers(row) <= self.reach else "[]"
        return Generation([Choice(text=f"\\boxed{{{answer}}}", finish_reason="stop", completion_tokens=3)] * n,
                          10 * n, 3 * n, 0.0)

    async def aclose(self) -> None:
        pass


async def test_calibration_descends_below_level_0_when_it_is_solved_too_rarely(tmp_path):
    """The draw of 2026-12-01: the 0.5B solved none of 16 families at level 0. A model that sorts at most 4 numbers
    solves none of level 0's (10 or more) and few of level -1's (3 to 32); the probe goes on down to level -2 (1 to
    10), chooses the level nearest the aim, and the splits come from it."""
    seed = 13
    made = [r for level in (0, -1, -2) for r in task_levels.rows("number_sorting", task_levels.AIM.problems, seed, level)]
    seen = []
    backend = NumberCounter(made, reach=4)
    result = await task_levels.calibrate(backend, "number_sorting", seed, Sampling(max_tokens=32),
                                         tmp_path, on_probe=lambda level, rate: seen.append(level))
    truth, asked = {}, {}
    for level in result.rates:
        written = [json.loads(line) for line in (tmp_path / f"probe-level{level}.jsonl").read_text().splitlines()]
        asked[level] = [backend.asked.count(r["problem"]) for r in written]
        read = [r for r, times in zip(written, asked[level]) if times]
        truth[level] = sum(numbers(r) <= 4 for r in read) / len(read)
    assert seen == [0, -1, -2] and result.rates == truth
    assert truth[0] == 0.0 and truth[-1] < task_levels.AIM.floor < truth[-2]
    # level 0 had none right in its first look: its other problems were never asked; the last level is read in full
    first = task_levels.AIM.first_look
    assert asked[0] == [2] * first + [0] * (task_levels.AIM.problems - first)
    assert asked[-2] == [2] * task_levels.AIM.problems
    # a first look with an answer right reads the level in full: sorting up to 6, one of level -1's first 8
    wider = NumberCounter(made, reach=6)
    assert (await task_levels.calibrate(wider, "number_sorting", seed, Sampling(max_tokens=32), tmp_path)).level == -1
    level_1 = [json.loads(line) for line in (tmp_path / "probe-level-1.jsonl").read_text().splitlines()]
    assert sum(numbers(r) <= 6 for r in level_1[:first]) == 1
    assert [wider.asked.count(r["problem"]) for r in level_1] == [2] * task_levels.AIM.problems
    assert result.level == -2 == task_levels.choose(result.rates)
    drawn = task_levels.split("number_sorting", {"train": 16}, seed, result.level)["train"]
    assert max(numbers(r) for r in drawn) <= 10
    # the rule before levels below 0 stops at level 0, as the runs to 2026-12-01 did
    before = task_levels.Aim(target=0.3, ceiling=0.45, problems=16, max_probes=6)
    assert (await task_levels.calibrate(NumberCounter(made, reach=4), "number_sorting", seed, Sampling(max_tokens=32),
                                        tmp_path, before)).rates == {0: 0.0}


def test_neighbouring_generator_seeds_share_problems_so_splits_come_from_one_stream():
    # why `split` exists: reasoning-gym seeds item i with seed + i, so seeds s and s + 1 are one stream shifted by one
    # (the benchmark's first splits shared 14 of 24 test problems with the training set this way)
    shifted = task_levels.rows("decimal_chain_sum", 5, 1001, 0)
    assert [r["problem"] for r in task_levels.rows("decimal_chain_sum", 6, 1000, 0)[1:]] == [r["problem"] for r in shifted]


def test_a_seed_makes_the_same_problems_in_every_process(tmp_path, monkeypatch, capfd):
    """isomorphic_strings draws letters from a set, whose order follows the process's string hash seed: seed 45 made
    other problems in every process, so a benchmark's splits could not be drawn again and its resume refused them.
    Hash seed 0 generates in the process itself; any other in a child, whose reply a generator's prints (codeio's,
    rectangle_count's) must not garble."""
    here = task_levels.rows("isomorphic_strings", 6, 45, 0)
    code = "import json, sys; from gym_tf import task_levels; print(json.dumps(task_levels.rows('isomorphic_strings', 6, 45, 0)))"
    for hash_seed in ("0", "1", "2"):
        child = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": hash_seed},
                               capture_output=True, text=True, check=True)
        assert json.loads(child.stdout) == here
    (tmp_path / "sitecustomize.py").write_text(  # a generator that prints, as rectangle_count does
        "import reasoning_gym\n"
        "made = reasoning_gym.create_dataset\n"
        "def create_dataset(*args, **kwargs):\n"
        "    print('Only placed 3 rectangles after 100000 attempts.')\n"
        "    return made(*args, **kwargs)\n"
        "reasoning_gym.create_dataset = create_dataset\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    capfd.readouterr()
    assert task_levels.rows("isomorphic_strings", 6, 45, 0) == here
    assert "Only placed 3 rectangles" in capfd.readouterr().err


@pytest.mark.skipif(not sys.flags.hash_randomization, reason="generates in this process: no child to time")
def test_a_generator_too_slow_to_finish_is_a_generation_error(tmp_path, monkeypatch):
    """sokoban's generator solves every puzzle it makes and ran past 10 minutes on a run's problems: the benchmark
    reports such a family as one it could not make and goes on, instead of waiting on it with nothing shown."""
    (tmp_path / "sitecustomize.py").write_text(
        "import time, reasoning_gym\n"
        "def create_dataset(*args, **kwargs):\n"
        "    time.sleep(60)\n"
        "reasoning_gym.create_dataset = create_dataset\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(task_levels, "GENERATION_MINUTES", 0.1)
    started = time.monotonic()
    with pytest.raises(task_levels.GenerationError, match=r"could not make 6 chain_sum problems in 0.1 min"):
        task_levels.rows("chain_sum", 6, 5, 0)
    assert time.monotonic() - started < 30


def test_a_family_whose_grader_gives_any_answer_full_marks_is_refused():
    """game_of_life_halting's grader compares bool(answer) with bool("False"): every answer scores 1, so a run on it
    reads 'solved 1.00' (the seed-76 screen) and measures nothing. It is refused before anything is sampled."""
    from rewards.reasoning_gym import NOT_AN_ANSWER, score

    row = task_levels.rows("chain_sum", 1, 5, 0)[0]
    assert score([NOT_AN_ANSWER], row["rg_task"], row["rg_entry"]) == [0.0]
    with pytest.raises(task_levels.GenerationError, match="game_of_life_halting grader gives full marks to any answer"):
        task_levels.rows("game_of_life_halting", 4, 76, 0)


def test_a_generator_that_fails_is_an_error_of_its_own_not_too_few_problems():
    """`has_problems` passes over a level on ConfigError (too few distinct problems): a failure to generate must not
    read as that, in the process or in a child."""
    with pytest.raises(task_levels.GenerationError, match="could not make no_such_family problems: ValueError: .*registered"):
        task_levels.has_problems("no_such_family", 0, 10, 45)
    code = "from gym_tf import task_levels; task_levels.rows('no_such_family', 2, 45)"
    child = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": "0"},
                           capture_output=True, text=True)
    assert child.returncode == 1 and "GenerationError: reasoning-gym could not make no_such_family" in child.stderr


def test_a_problem_the_generator_gives_up_on_is_left_out_not_the_family(capfd):
    """countdown at level 1 gives up on seed 1206000100 ("Failed to generate valid expression after 100 attempts"),
    one of the 384 problems the benchmark's splits drew for draw-1206, which refused the whole family: the problems
    around it are made, and the one is left out with a line saying so. One that makes none is the family's error."""
    made = task_levels.rows("countdown", 3, 1_206_000_099, 1)
    assert [r["id"] for r in made] == ["countdown-1206000099-0", "countdown-1206000099-1"]  # numbered as made
    assert "countdown: 1 of 3 problems left out: the generator could not make them (ValueError: Failed" in \
        capfd.readouterr().err
    assert made[0]["problem"] == task_levels.rows("countdown", 1, 1_206_000_099, 1)[0]["problem"]
    assert made[1]["problem"] == task_levels.rows("countdown", 1, 1_206_000_101, 1)[0]["problem"]

    class NeverMade:
        def __len__(self):
            return 2

        def __getitem__(self, index):
            raise ValueError(f"no problem {index}")

    with pytest.raises(ValueError, match="no problem 0"):
        task_levels.made_apart("nothing", NeverMade())


@pytest.mark.parametrize("family, level", [("decimal_chain_sum", 0), ("basic_arithmetic", 0), ("chain_sum", None)])
def test_splits_are_disjoint_by_problem_text_and_avoid_what_the_probes_showed(family, level):
    probes = {r["problem"] for r in task_levels.rows(family, 8, 13_000_000, level)}  # the splits' own first items
    drawn = task_levels.split(family, {"train": 16, "val": 6, "test": 24}, 13_000_000, level, avoid=frozenset(probes))
    assert {name: len(rows) for name, rows in drawn.items()} == {"train": 16, "val": 6, "test": 24}
    texts = [r["problem"] for rows in drawn.values() for r in rows]
    assert len(set(texts)) == 46 and not probes & set(texts)
    assert len({r["id"] for rows in drawn.values() for r in rows}) == 46
    assert drawn == task_levels.split(family, {"train": 16, "val": 6, "test": 24}, 13_000_000, level,
                                      avoid=frozenset(probes))  # the same seed, the same splits


def test_a_family_with_too_few_distinct_problems_is_a_named_error(monkeypatch):
    from gym_tf.errors import ConfigError

    repeating = lambda family, size, seed, level=None: [{"id": str(i), "problem": f"q{i % 5}"} for i in range(size)]  # noqa: E731
    monkeypatch.setattr(task_levels, "rows", repeating)
    with pytest.raises(ConfigError, match=r"toy at level 0: 5 distinct problems in 80 drawn, 10 needed"):
        task_levels.split("toy", {"train": 6, "test": 4}, 0, 0)
    assert [r["problem"] for r in task_levels.split("toy", {"train": 3, "test": 2}, 0, 0)["test"]] == ["q3", "q4"]
    with pytest.raises(ConfigError, match="every split needs at least one problem"):
        task_levels.split("toy", {"train": 3, "test": 0}, 0, 0)


def test_an_answer_the_grader_cannot_read_scores_zero_and_a_broken_row_is_raised():
    """reasoning-gym's prime_factorization grader calls int() on the answer: free text raised out of the reward and
    stopped a benchmark run. Graded by the real grader: unreadable answers score 0, the right one 1 (boxed or on
    the last line); a row whose own answer cannot be graded is still an error."""
    from rewards.reasoning_gym import score

    row = task_levels.rows("prime_factorization", 1, 41, 0)[0]
    right = row["answer"]
    answers = [f"\\boxed{{{right}}}", "So, the prime factorization is", "\\boxed{two times three}",
               f"The factors are:\n{right}"]
    assert score(answers, row["rg_task"], row["rg_entry"]) == [1.0, 0.0, 0.0, 1.0]
    broken = json.dumps({**json.loads(row["rg_entry"]), "answer": "not a factorization"})
    with pytest.raises(ValueError):
        score(answers, row["rg_task"], broken)


def test_a_grid_familys_entry_keeps_its_tuples_so_its_grader_still_gives_its_own_answer_full_marks():
    """arc_agi's and rearc's graders compare with a tuple grid in the entry: stored as plain JSON (lists), the
    grader gave the reference answer itself 0.05, and every right answer of a run would have been graded wrong.
    Real generator, real grader, through the stored row."""
    from rewards.reasoning_gym import entry_text, read_entry, reference_grade, score

    for row in task_levels.rows("rearc", 3, 123, 0):
        right = row["answer"]
        assert "\n" in right  # a grid, one row per line
        full, cut = score([f"The output grid:\n\\boxed{{{right}}}", f"\\boxed{{{right[:-8]}}}"], "rearc",
                          row["rg_entry"])
        assert full == 1.0 and cut < 1
        as_lists = json.loads(row["rg_entry"], object_hook=lambda d: d.get("__tuple__", d))
        assert reference_grade("rearc", as_lists) < 1
        assert reference_grade("rearc", read_entry(row["rg_entry"])) == 1
    nested = {"grid": ((1, 2), (3, 4)), "mixed": [(5,), {"t": (6, [7])}], "text": "(1, 2)", "none": None}
    assert read_entry(entry_text(nested)) == nested
    assert read_entry(json.dumps({"plain": [1, 2]})) == {"plain": [1, 2]}  # rows written before the tuples were kept


def test_a_family_whose_grader_fails_its_own_answer_is_refused_before_anything_is_sampled(monkeypatch):
    """Where the grader gives the entry's own answer less than full marks, no answer of the model can be graded
    right: such a problem is left out when the problems are made, a family with no other is refused (the benchmark
    reports it and goes on), and a row already written is refused by the reward. Families whose entries carry no
    answer (the grader checks validity) are graded as before."""
    import rewards.reasoning_gym as rg

    row, other = task_levels.rows("leg_counting", 2, 7, 0)
    real = rg._grader("leg_counting")
    # one problem the grader fails is left out, the others are kept
    monkeypatch.setattr(rg, "_grader", lambda task, settings="{}": lambda answer, e: 0.5
                        if e["question"] == row["problem"] else real(answer, e))
    assert [r[0] for r in task_levels._made("leg_counting", 2, 7, 0)] == [other["problem"]]
    monkeypatch.setattr(rg, "_grader", lambda task, settings="{}": lambda answer, entry: 0.5)
    with pytest.raises(task_levels.GenerationError, match=r"leg_counting problems gym-tf can grade: its grader gives "
                                                          r"problem 0's own answer '\d+' 0\.50"):
        task_levels._made("leg_counting", 2, 7, 0)
    with pytest.raises(ValueError, match="gives this row's own answer 0.50, so it cannot grade others"):
        rg.score([f"\\boxed{{{row['answer']}}}"], "leg_counting", row["rg_entry"])
    graph = task_levels.rows("graph_color", 1, 7, 0)[0]  # a real family whose entries carry no answer
    assert graph["answer"] == task_levels.NO_SINGLE_ANSWER and json.loads(graph["rg_entry"])["answer"] is None
    no_answer = json.dumps({**json.loads(row["rg_entry"]), "answer": None})
    assert rg.reference_grade("leg_counting", json.loads(no_answer)) is None
    assert rg.score(["\\boxed{3}"], "leg_counting", no_answer) == [0.5]


def test_a_row_made_at_a_level_is_graded_by_the_grader_of_that_levels_settings():
    """Some graders read their generator's settings, and were built at the family's defaults whatever level made
    the problems: time_intervals' partial credit is 1 - error / max_time_difference_seconds (60 s at level 0, 86400
    at the defaults), so an answer 10 s off earned 0.9999; puzzle24's grader pays any four numbers in the settings'
    range (1 to 5 at level 0, 1 to 10 at the defaults); word_ladder's grader had no words of three letters and failed
    its own answers, so the family could not be run (2026-12-07). Real generators, real graders, through the rows."""
    from rewards.reasoning_gym import score

    timed = next(r for r in task_levels.rows("time_intervals", 40, 1206, 0)
                 if json.loads(r["rg_entry"])["metadata"]["task_type"] == "time_seconds")
    assert json.loads(timed["rg_config"])["max_time_difference_seconds"] == 60
    hours, minutes, seconds = (int(part) for part in timed["answer"].split(":"))
    late = hours * 3600 + minutes * 60 + seconds + 10
    off = f"\\boxed{{{late // 3600:02d}:{late // 60 % 60:02d}:{late % 60:02d}}}"
    right = f"\\boxed{{{timed['answer']}}}"
    assert score([right, off], "time_intervals", timed["rg_entry"], timed["rg_config"]) == [1.0, pytest.approx(5 / 6)]
    assert score([off], "time_intervals", timed["rg_entry"])[0] > 0.999  # the defaults' grader, as before the fix

    puzzle = task_levels.rows("puzzle24", 1, 1206, 0)[0]
    assert json.loads(puzzle["rg_config"]) == {"max_value": 5}
    out_of_range = "\\boxed{8*3*1*1}"  # makes 24, with a number level 0 never gives
    assert score([out_of_range], "puzzle24", puzzle["rg_entry"], puzzle["rg_config"])[0] < 1
    assert score([out_of_range], "puzzle24", puzzle["rg_entry"]) == [1.0]

    ladders = task_levels.rows("word_ladder", 8, 1206, 0)
    three = next(r for r in ladders if len(r["answer"].split(",")[0]) == 3)
    assert score([f"\\boxed{{{three['answer']}}}"], "word_ladder", three["rg_entry"], three["rg_config"]) == [1.0]
    assert task_levels.rows("leg_counting", 1, 7)[0]["rg_config"] == "{}"  # the defaults: nothing to carry


def test_a_resume_refuses_rows_written_before_they_carried_their_settings():
    """A benchmark resumed with `--resume` reuses its split files: rows written before 2026-12-07 carry no settings,
    and would be graded at the family's defaults again. Refused where the level's settings are not the defaults;
    rows that carry them, and rows made at the defaults, are taken."""
    from gym_tf.errors import ConfigError

    made = task_levels.rows("time_intervals", 2, 1206, 0)
    old = [{k: v for k, v in row.items() if k != "rg_config"} for row in made]
    with pytest.raises(ConfigError, match="time_intervals problems at level 0 were written before rows carried"):
        task_levels.check_settings_carried("time_intervals", 0, old)
    task_levels.check_settings_carried("time_intervals", 0, made)
    task_levels.check_settings_carried("time_intervals", None, old)


def test_an_answer_in_latex_is_graded_as_plain_text_too():
    """The solve prompt asks for \\boxed{}, so the model writes \\frac{1}{8}; coin_flip's grader reads "1/8" and
    "0.125" but scored the LaTeX 0, right answers counted as wrong. Graded by the real graders: a LaTeX fraction of
    the right value scores 1, a wrong one still scores below 1, and a grader that reads LaTeX itself keeps its
    grade."""
    from fractions import Fraction

    from rewards.reasoning_gym import score

    row = next(r for r in task_levels.rows("coin_flip", 20, 5, 0) if r["answer"] not in ("0.5", "1.0"))
    right = Fraction(row["answer"]).limit_denominator(1000)
    wrong = right / 2
    answers = [f"so \\boxed{{\\frac{{{right.numerator}}}{{{right.denominator}}}}}",
               f"\\boxed{{\\dfrac{{{right.numerator}}}{{{right.denominator}}}}}", f"\\boxed{{{row['answer']}}}",
               f"\\boxed{{\\frac{{{wrong.numerator}}}{{{wrong.denominator}}}}}"]
    grades = score(answers, row["rg_task"], row["rg_entry"])
    assert grades[:3] == [1.0, 1.0, 1.0] and grades[3] < 1.0
    fraction = task_levels.rows("fraction_simplification", 1, 5, 0)[0]
    right_latex, wrong_latex = score([f"\\boxed{{{fraction['answer'].strip('$')}}}", "\\boxed{\\frac{1}{1000}}"],
                                     fraction["rg_task"], fraction["rg_entry"])
    assert right_latex == 1.0 and wrong_latex < 1.0


class AlwaysRight:
    """Answers every problem with its reference answer."""

    model = "always-right"

    def __init__(self, answers: dict[str, str]):
        self.answers, self.problems = answers, []

    async def generate(self, messages, n=1, **sampling) -> Generation:
        self.problems.append(messages[-1]["content"])
        answer = self.answers[messages[-1]["content"]]
        return Generation([Choice(text=f"\\boxed{{{answer}}}", finish_reason="stop", completion_tokens=3)] * n,
                          10 * n, 3 * n, 0.0)

    async def aclose(self) -> None:
        pass


async def test_calibration_passes_over_levels_too_small_for_the_splits(tmp_path):
    """coin_flip's level 0 has 8 distinct problems, level 1 18: a run that needs 46 chose level 0 and stopped at its
    splits after paying for the probe. With the splits' size, such levels are not probed, and the level chosen can
    fill the splits."""
    aim = task_levels.Aim(target=0.3, ceiling=0.45, problems=4, max_probes=1)
    answers = {r["problem"]: r["answer"] for level in range(4) for r in task_levels.rows("coin_flip", 64, 9, level)}
    backend = AlwaysRight(answers)
    result = await task_levels.calibrate(backend, "coin_flip", 9, Sampling(max_tokens=32), tmp_path, aim, needed=20)
    assert result.too_few == (0, 1) and result.rates == {2: 1.0} and result.level == 2
    task_levels.split("coin_flip", {"train": 20}, 9, result.level)  # the chosen level fills the splits
    assert not (tmp_path / "probe-level0.jsonl").exists() and len(backend.problems) == 4
    # without the splits' size: level 0 is probed, as before
    assert (await task_levels.calibrate(AlwaysRight(answers), "coin_flip", 9, Sampling(max_tokens=32), tmp_path,
                                        aim)).rates == {0: 1.0}



async def test_a_level_the_generator_fails_at_is_passed_over_and_a_family_it_fails_at_every_level_is_its_error(
        tmp_path, monkeypatch):
    """A generator that fails at one level (a problem all of whose answers its grader refuses, an assertion in its
    code) must not cost the levels around it, probes already paid for included; one that fails at every level
    (knight_swap, reasoning-gym 0.1.25) is the family's error, before any answer."""
    made = task_levels.rows

    def failing_at_1(family, size, seed, level=None):
        if level == 1:
            raise task_levels.GenerationError("reasoning-gym could not make coin_flip problems: AssertionError")
        return made(family, size, seed, level)

    monkeypatch.setattr(task_levels, "rows", failing_at_1)
    answers = {r["problem"]: r["answer"] for level in (0, 2) for r in made("coin_flip", 64, 9, level)}
    aim = task_levels.Aim(target=0.3, ceiling=0.45, problems=4, max_probes=2)
    result = await task_levels.calibrate(AlwaysRight(answers), "coin_flip", 9, Sampling(max_tokens=32), tmp_path, aim,
                                         needed=4)
    assert result.rates == {0: 1.0, 2: 1.0} and result.too_few == ()
    monkeypatch.setattr(task_levels, "rows", made)
    backend = AlwaysRight({})
    with pytest.raises(task_levels.GenerationError, match="could not make knight_swap problems"):
        await task_levels.calibrate(backend, "knight_swap", 9, Sampling(max_tokens=32), tmp_path, needed=10)
    assert backend.problems == []


async def test_a_family_with_no_level_big_enough_for_the_splits_is_a_named_error_before_any_answer(tmp_path,
                                                                                                    monkeypatch):
    from gym_tf.errors import ConfigError

    repeating = lambda family, size, seed, level=None: [{"id": str(i), "problem": f"q{i % 5}"} for i in range(size)]  # noqa: E731
    monkeypatch.setattr(task_levels, "rows", repeating)
    monkeypatch.setattr(task_levels, "max_level", lambda family: 2)
    backend = AlwaysRight({})
    with pytest.raises(ConfigError, match="toy: no level from 0 to 2 makes 10 distinct problems"):
        await task_levels.calibrate(backend, "toy", 9, Sampling(max_tokens=32), tmp_path, needed=10)
    assert backend.problems == []
