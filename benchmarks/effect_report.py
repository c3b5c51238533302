"""The learning-effect benchmark's results: a table row from each family's comparison, the README's table and its
across-families lines (with the shortcuts a gain can hide: the test split's most common answer, an answer the
problem states, answers that earn as much on other problems, partial credit alone), the archive of every run
(`benchmarks/results/learning_effect.json`), and the plot of them all."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from benchmarks.effect_cli import (AUTO_SWITCHES, FIRST_TRAIN, LATER_SETTINGS, arguments, changed_settings,
                                   minutes_arg)
from gym_tf import task_levels
from gym_tf.errors import ConfigError
from gym_tf.metrics import bootstrap

ARCHIVE = Path(__file__).resolve().parent / "results" / "learning_effect.json"
README = Path(__file__).resolve().parents[1] / "README.md"
TABLE_MARK = "<!-- learning-effect-table -->"
# the settings a count across families is kept apart by: each (training problems, epochs) run gets a line of its own
COUNTED_APART = ("train", "epochs")
# an interval's low end at or under this is at 0: a difference of equal sums can come out 5e-18 in floating point
NOISE_FLOOR = 1e-9


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
            "labeled_examples": c.get("labeled_examples"), "examples_as_turns": c.get("examples_as_turns")} | (
        # where the grader paid partial credit, the gain in answers paid in full; None: it paid none (recorded since
        # 2026-12-07: a row without the key was not checked)
        {"diff_full_credit": learned["full_credit_vs_baseline"] and interval(learned["full_credit_vs_baseline"])}
        if "full_credit_vs_baseline" in learned else {}) | (
        # Mean@k of the learned arm's answers given to other problems, and its gain beyond that (since 2026-12-07)
        # (None: not measured, a row without the keys: not checked)
        {"swapped_mean": learned["swapped_mean"],
         "diff_beyond_swapped": interval(learned["mean_vs_baseline_beyond_swapped"])}
        if learned.get("mean_vs_baseline_beyond_swapped") else {})


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
        f"| {r['family']} | {r['seed']} | {r['level']} | {r['model']} | {r['learner']} | {r['test']} x {r['k']} | {r['none_mean']:.3f} | {r['learned_mean']:.3f} | {ci(r['diff'])}{gain_checks(r, ci)} | "
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
    answer given every time, the answer a test problem states, `no_gain_where_unstated`, answers that earn as much on
    other problems, `no_gain_beyond_swapped`, and partial credit alone, `no_full_credit_gain`), since a count by the
    latest row drifts as near misses are rerun. `unchecked`: the families whose latest row met both beyond the
    shortcuts without having been checked for the last two (archived before 2026-12-07)."""
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
    named = answered_alike + copied_stated
    swapped_alike = sorted(r["family"] for r in both if no_gain_beyond_swapped(r) and r["family"] not in named)
    partial_only = sorted(r["family"] for r in both if no_full_credit_gain(r)
                          and r["family"] not in named + swapped_alike)
    shortcut = lambda r: (no_gain_beyond_constant(r) or no_gain_where_unstated(r)  # noqa: E731
                          or no_gain_beyond_swapped(r) or no_full_credit_gain(r))
    every_met = [r for r in at_defaults if met(r)]
    every_beyond = [r for r in every_met if not shortcut(r)]
    others = [r for r in runs if r["family"] not in named + swapped_alike + partial_only]
    return {"policy": policy, "setting": None if setting == default else setting, "families": len(runs),
            "both": sorted(r["family"] for r in both),
            "constant_families": answered_alike, "stated_families": copied_stated,
            "swapped_families": swapped_alike, "partial_families": partial_only,
            "mean_diff_without_constant": over("diff", others) if len(others) < len(runs) else None,
            "majority_diff_without_constant": over("majority_diff", others) if len(others) < len(runs) else None,
            "unchecked": sorted(r["family"] for r in both if not shortcut(r) and "diff_beyond_swapped" not in r),
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
               f"{', '.join(shortcut_families(summary))})"
               if summary.get("mean_diff_without_constant") else "")
            + f", the votes' mean {summary['majority_diff']}"
            + (f" ({summary['majority_diff_without_constant']} without them)"
               if summary.get("majority_diff_without_constant") else "")
            + "; 95% intervals of the mean over these families, resampling families" + every_run_text(summary) + "\n")


def every_run_text(summary: dict) -> str:
    every, best = summary["every_run"], summary["best"]
    where = f"at {setting_text(summary['setting'])}" if summary.get("setting") else "at the defaults"
    return (f". Every row {where}, reruns included: {every['both']} of {every['runs']} met both conditions, "
            f"{every['beyond']} beyond the most common answer, any answer stated in the problem, and, where checked, "
            "answers given to other problems and partial credit alone; by each family's best row, "
            f"{len(best['both'])} of {summary['families']} families met both, {len(best['beyond'])} beyond them")


def no_gain_where_unstated(r: dict) -> bool:
    """Whether a run's gain may be copying the answer its test problems state ('Calculate the following: 2*x'):
    where some state it and others do not, no gain beyond noise on the others."""
    return bool(r.get("diff_where_unstated")) and r["diff_where_unstated"][1] <= 0


def no_full_credit_gain(r: dict) -> bool:
    """Whether a run's gain may be partial credit alone (tsumego pays 0.05 for any legal move): where its grader
    paid partial credit, no gain beyond noise in the answers paid in full."""
    return bool(r.get("diff_full_credit")) and r["diff_full_credit"][1] <= NOISE_FLOOR


def no_gain_beyond_swapped(r: dict) -> bool:
    """Whether a run's gain may be a prior over answers (its most common answer, the answer's form, an answer any
    problem pays, a spread of likely answers): where recorded, its answers given to other problems earn about as
    much, so the gain beyond that is not beyond noise."""
    return bool(r.get("diff_beyond_swapped")) and r["diff_beyond_swapped"][1] <= NOISE_FLOOR


def shortcut_families(summary: dict) -> list[str]:
    """The families whose latest row met both conditions by a shortcut, named in the order the line names them."""
    return (summary["constant_families"] + summary.get("stated_families", []) + summary.get("swapped_families", [])
            + summary.get("partial_families", []))


def constant_caveat(summary: dict) -> str:
    found, stated = summary.get("constant_families"), summary.get("stated_families")
    swapped, partial = summary.get("swapped_families"), summary.get("partial_families")
    parts = ([f"{', '.join(found)}: no better than its most common answer given every time"] if found else []) + (
        [f"{', '.join(stated)}: no gain where the problem does not state its answer"] if stated else []) + (
        [f"{', '.join(swapped)}: no gain beyond its answers given to other problems"] if swapped else []) + (
        [f"{', '.join(partial)}: no more answers paid in full"] if partial else [])
    unchecked = summary.get("unchecked")
    if unchecked:
        beyond = len(summary["both"]) - len(shortcut_families(summary))
        parts.append(f"{len(unchecked)} of the {beyond} {'others' if parts else 'families'} not checked against their "
                     "answers given to other problems or for partial credit alone: run before 2026-12-07")
    return f" ({'; '.join(parts)})" if parts else ""


def gain_checks(r: dict, ci) -> str:
    """The Mean@k cell's tail: the gain beyond the learned answers given to other problems (what they earned there),
    and where the grader paid partial credit, the gain in answers paid in full."""
    swapped = (f"; beyond its answers given to other problems ({r['swapped_mean']:.3f}): "
               f"{ci(r['diff_beyond_swapped'])}" if r.get("diff_beyond_swapped") else "")
    return swapped + (f"; answers paid in full: {ci(r['diff_full_credit'])}" if r.get("diff_full_credit") else "")


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
