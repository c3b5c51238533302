"""Lexical relevance for picking library items per request: BM25+ (rank-bm25), no model weights, deterministic.

BM25+ rather than plain BM25 (Okapi): Okapi gives a word found in half the items or more a weight of zero or
less, so in a small library whose items share wording the unrelated item can outrank the relevant one.

The same (texts, query) always gives the same order, on every machine, so optimize, eval and serve show a request
the same items, and a stored rollout can be replayed.
"""

from __future__ import annotations

import re
from functools import lru_cache

from rank_bm25 import BM25Plus

_WORD = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def rank(texts: list[str], query: str) -> list[int]:
    """Indices of `texts`, most relevant to `query` first; ties (and no shared word) keep the newer text first."""
    scores = _index(tuple(texts)).get_scores(tokens(query))
    return sorted(range(len(texts)), key=lambda i: (-round(float(scores[i]), 9), -i))


@lru_cache(maxsize=64)
def _index(texts: tuple[str, ...]) -> BM25Plus:
    """One index per library's item texts, built once: a server answers many requests from the same version."""
    return BM25Plus([tokens(t) or ["\0"] for t in texts])
