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


def rank(texts: list[str], query: str, limit: int | None = None, *, length_norm: bool = True,
         prior: list[float] | None = None) -> list[int]:
    """Indices of `texts`, most relevant to `query` first (the first `limit` of them); ties (and no shared word)
    go to the higher `prior`, then to the newer text.

    `length_norm=False` scores a text by the words it shares with the query alone (BM25's b = 0). With length
    normalization, texts that share the same words rank shortest first: where every text follows one template (a
    generated task family), that is the only thing that orders them.

    Only texts sharing a word with the query are scored. The rest all score the same (BM25+ gives a missing word
    the same idf x delta in every text) and below any text with a shared word (whose part is larger), so they
    follow, by prior and then newest first: the order of scoring everything, at a cost that grows with the
    matches, not the library.
    """
    index, postings = _index(tuple(texts), 0.75 if length_norm else 0.0)
    words = tokens(query)
    weight = prior or [0.0] * len(texts)
    matched = sorted({i for w in set(words) for i in postings.get(w, ())})
    scores = index.get_batch_scores(words, matched) if matched else []
    order = [i for _, i in sorted(((-round(float(s), 9), -weight[i], -i), i) for s, i in zip(scores, matched))]
    if limit is not None and len(order) >= limit:
        return order[:limit]
    seen = set(matched)
    newest_first = range(len(texts) - 1, -1, -1)
    rest = (i for i in (newest_first if prior is None else sorted(newest_first, key=lambda i: -weight[i]))
            if i not in seen)
    order.extend(rest if limit is None else (i for _, i in zip(range(limit - len(order)), rest)))
    return order


@lru_cache(maxsize=64)
def _index(texts: tuple[str, ...], b: float) -> tuple[BM25Plus, dict[str, list[int]]]:
    """One index per library's item texts, built once (a server answers many requests from the same version), and
    which texts hold each word."""
    corpus = [tokens(t) or ["\0"] for t in texts]
    postings: dict[str, list[int]] = {}
    for i, words in enumerate(corpus):
        for word in set(words):
            postings.setdefault(word, []).append(i)
    return BM25Plus(corpus, b=b), postings
