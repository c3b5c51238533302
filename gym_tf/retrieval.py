"""Lexical relevance for picking library items per request: BM25 (rank-bm25), no model weights, deterministic.

The same (texts, query) always gives the same order, on every machine, so optimize, eval and serve show a request
the same items, and a stored rollout can be replayed.
"""

from __future__ import annotations

import re

from rank_bm25 import BM25Okapi

_WORD = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def rank(texts: list[str], query: str) -> list[int]:
    """Indices of `texts`, most relevant to `query` first; ties (and no shared word) keep the newer text first."""
    corpus = [tokens(t) or ["\0"] for t in texts]
    scores = BM25Okapi(corpus).get_scores(tokens(query))
    return sorted(range(len(texts)), key=lambda i: (-round(float(scores[i]), 9), -i))
