# SPDX-License-Identifier: Apache-2.0
"""Keep the evaluation sets out of the training prompts: exact and near copies of HumanEval and MT-Bench.

Texts are compared as lower-cased word sequences (``[a-z0-9]+`` runs), so case, whitespace, punctuation and code
formatting do not hide a copy. A candidate is flagged when it shares word ``n``-grams with one evaluation text and

  * those cover >= ``threshold`` of the evaluation text's n-grams (the eval prompt is inside the candidate, whole
    or lightly edited: a renamed function, a reworded sentence, a wrapper such as "Solve this: ..."), or
  * they cover >= ``threshold`` of the candidate's own n-grams and number at least ``MIN_PIECE`` (the candidate is
    a piece of an eval prompt; one shared 6-gram in a short chat turn, "what is the name of the game?" against an
    MT-Bench passage, is ordinary English, not a copy).

Evaluation texts shorter than ``n`` words ("Now make it concise.") have no n-gram: only an exact match of the
whole normalised candidate counts for them. This is the n-gram-overlap rule of the GPT-3 / Llama decontamination
reports, with a coverage threshold instead of a single hit because HumanEval's phrasing ("return the number of",
">>> ") is ordinary docstring language.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

N_WORDS = 6
THRESHOLD = 0.3
MIN_PIECE = 3   # shared n-grams (8+ words in a row) before a short candidate counts as a piece of an eval text
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(ws: list[str], n: int = N_WORDS) -> set[tuple[str, ...]]:
    return {tuple(ws[i:i + n]) for i in range(len(ws) - n + 1)}


@dataclass(frozen=True)
class Match:
    eval_id: str
    coverage: float   # share of the eval text's n-grams found in the candidate
    share: float      # share of the candidate's n-grams found in the eval text


class Decontaminator:
    """An index of the evaluation texts; ``match(text)`` says which one ``text`` copies, if any."""

    def __init__(self, evals: dict[str, str], n: int = N_WORDS, threshold: float = THRESHOLD):
        self.n, self.threshold = n, threshold
        self._size: dict[str, int] = {}
        self._index: dict[tuple[str, ...], list[str]] = {}
        self._short: dict[tuple[str, ...], str] = {}
        for eid, text in evals.items():
            ws = words(text)
            grams = ngrams(ws, n)
            if not grams:
                if ws:
                    self._short[tuple(ws)] = eid
                continue
            self._size[eid] = len(grams)
            for g in grams:
                self._index.setdefault(g, []).append(eid)

    def __len__(self) -> int:
        return len(self._size) + len(self._short)

    def match(self, text: str) -> Match | None:
        ws = words(text)
        if tuple(ws) in self._short:
            return Match(self._short[tuple(ws)], 1.0, 1.0)
        grams = ngrams(ws, self.n)
        if not grams:
            return None
        hits: Counter[str] = Counter()
        for g in grams:
            for eid in self._index.get(g, ()):
                hits[eid] += 1
        for eid, k in hits.most_common():
            m = Match(eid, k / self._size[eid], k / len(grams))
            if m.coverage >= self.threshold or (m.share >= self.threshold and k >= MIN_PIECE):
                return m
        return None


def eval_sets(*, cache_dir=None, progress: bool = True) -> dict[str, str]:
    """{id: text}: the 164 HumanEval prompts (signature + docstring, as shipped) and both turns of the 80
    MT-Bench questions."""
    from ..data import HUMANEVAL_TEMPLATE, load_prompts

    head, tail = HUMANEVAL_TEMPLATE.split("{prompt}")
    out = {}
    for p in load_prompts("humaneval", cache_dir=cache_dir, progress=progress):
        msg = p.messages[0]["content"]
        out[p.id] = msg[len(head): len(msg) - len(tail)]
    for p in load_prompts("mtbench", turn=2, cache_dir=cache_dir, progress=progress):
        for k, m in enumerate(p.messages, 1):
            out[f"mtbench/{p.id}/turn{k}"] = m["content"]
    return out
