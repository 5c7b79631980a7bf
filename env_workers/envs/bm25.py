"""A small BM25 index in pure Python, for the `search_qa` and `shop` environments.

    idx = BM25({"d1": "the red mug", "d2": "a blue shirt"})
    idx.search("red mug", k=5)     # [("d1", 1.38...)]

Tokens are lowercased alphanumeric runs. Deterministic: ties break by document id.
"""

from __future__ import annotations

import math
import re
from collections import Counter

_TOKEN = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class BM25:
    def __init__(self, docs: dict[str, str], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._tf = {d: Counter(tokens(t)) for d, t in docs.items()}
        self._len = {d: sum(tf.values()) for d, tf in self._tf.items()}
        self._avg = sum(self._len.values()) / max(len(self._len), 1)
        df: Counter[str] = Counter()
        for tf in self._tf.values():
            df.update(tf.keys())
        n = len(self._tf)
        self._idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}

    def search(self, query: str, k: int = 5) -> list[tuple[str, float]]:
        q = set(tokens(query))
        scores: list[tuple[str, float]] = []
        for d, tf in self._tf.items():
            s = 0.0
            for t in q & tf.keys():
                f = tf[t]
                s += self._idf[t] * f * (self.k1 + 1) / (f + self.k1 * (1 - self.b + self.b * self._len[d] / self._avg))
            if s > 0:
                scores.append((d, s))
        scores.sort(key=lambda x: (-x[1], x[0]))
        return scores[:k]
