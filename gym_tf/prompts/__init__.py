"""Every prompt gym-tf sends, as plain text templates beside this file (str.format slots)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

ECHO_WORDS = 6  # a run of this many words taken from a template is the prompt echoed back, not the model's own text

_WORD = re.compile(r"\w+")
_SLOT = re.compile(r"\{\{.*?\}\}|\{[a-z_]*\}")  # JSON shown in a template, and the str.format slots
_PLACEHOLDER = re.compile(r"<[^<>{}\n]{1,40}>")  # "<a new lesson>": a blank the reply was to fill
# A retry's error names the field of the reply it is at ("... write the advice itself at operations.0.add.text");
# the 0.5B learner wrote "State the advice itself at operations.0.add.text" back as a lesson (coin_flip seed 5, two
# epochs, on a 2-core AMD EPYC, 2026-11-26).
_REPLY_FIELD = re.compile(r"\boperations\.\d+(?:\.\w+)*", re.IGNORECASE)  # "at operations.0" when the op is wrong


@cache
def template(name: str) -> str:
    return (resources.files(__package__) / f"{name}.txt").read_text(encoding="utf-8").strip()


def render(name: str, **slots: object) -> str:
    return template(name).format(**slots)


@cache
def _names() -> tuple[str, ...]:
    return tuple(sorted(f.name.removesuffix(".txt") for f in resources.files(__package__).iterdir()
                        if f.name.endswith(".txt")))


@cache
def _phrases() -> frozenset[tuple[str, ...]]:
    out = set()
    for name in _names():
        for part in _SLOT.split(template(name)):  # a run never spans a slot: the filled text is not ours
            words = [w.lower() for w in _WORD.findall(part)]
            out.update(tuple(words[i:i + ECHO_WORDS]) for i in range(len(words) - ECHO_WORDS + 1))
    return frozenset(out)


@cache
def _placeholders() -> frozenset[str]:
    return frozenset(p for name in _names() for p in _PLACEHOLDER.findall(template(name)))


def copied_from_prompts(text: str) -> str | None:
    """The part of `text` copied from gym-tf's own prompts, if any: a blank left unfilled ("<a new lesson>") or a run
    of `ECHO_WORDS` words of a template, or the reply's field that a retry's error named. A 0.5B learner, asked for
    a lesson, answered with the summarize prompt's first sentence followed by "... is <a new lesson>." (the README's
    main command); a solver reads such text as noise."""
    blank = next((p for p in _placeholders() if p in text), None)
    if blank:
        return blank
    field = _REPLY_FIELD.search(text)
    if field:
        return field.group(0)
    words = [w.lower() for w in _WORD.findall(text)]
    return next((" ".join(words[i:i + ECHO_WORDS]) for i in range(len(words) - ECHO_WORDS + 1)
                 if tuple(words[i:i + ECHO_WORDS]) in _phrases()), None)
