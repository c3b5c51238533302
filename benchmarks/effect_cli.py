"""The learning-effect benchmark's command line (`benchmarks/learning_effect.py`): its options and their defaults,
the settings a family's run records (what `--resume` must repeat, what a row's label names where it left the
defaults), and the `auto` choices read off the level probe."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from gym_tf import task_levels
from gym_tf.errors import ConfigError

DEFAULT_FAMILIES = "leg_counting,gcd,basic_arithmetic,time_intervals"
SCREEN_PROBLEMS = 8
AIMS = {"band": task_levels.AIM, "half": task_levels.FIRST_AIM}
HINTED_ANSWERS = 2  # `--hinted-examples auto`: answers told the reference answer, per problem without an example
# the training-set size of every run before --train was varied (and the default still): rows that did not record
# their size ran it, unless their label names another
FIRST_TRAIN = 16
LEARN_MINUTES = 30.0  # the default learning time limit since 2026-11-30 (learning_effect.py says why)
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


def arguments(description: str | None = None) -> argparse.ArgumentParser:
    """The benchmark's command line; `description` is its --help text (the script's docstring)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
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
