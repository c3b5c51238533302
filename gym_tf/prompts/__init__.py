"""Every prompt gym-tf sends, as plain text templates beside this file (str.format slots)."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def template(name: str) -> str:
    return (resources.files(__package__) / f"{name}.txt").read_text(encoding="utf-8").strip()


def render(name: str, **slots: object) -> str:
    return template(name).format(**slots)
