# SPDX-License-Identifier: Apache-2.0
"""The prompts a sweep sends, and how streamed text is counted in tokens.

Prompts: a real packaged dataset (HumanEval, MT-Bench first turns, ShareGPT first turns; rendered with
the target's chat template) or ``random`` token ids of a fixed length (benchmark_serving's random
dataset). Endpoints get text and the engine gets token ids, both from the same prompt.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DFlashError

DATASETS = ("humaneval", "mtbench", "sharegpt", "random")


@dataclass(frozen=True)
class WorkItem:
    """One prompt. ``prompt_ids`` is what the in-process engine gets; ``text`` what an endpoint gets."""

    prompt_ids: tuple[int, ...]
    text: str | None = None


def load_workload(dataset: str, tokenizer, *, num_prompts: int, input_len: int | None = None,
                  vocab_size: int | None = None, seed: int = 0) -> list[WorkItem]:
    """``num_prompts`` distinct prompts (fewer if the dataset has fewer; callers cycle them)."""
    if dataset == "random":
        return _random(tokenizer, num_prompts, input_len, vocab_size, seed)
    if dataset not in DATASETS:
        raise DFlashError("--dataset", f"unknown dataset {dataset!r}", f"use one of {', '.join(DATASETS)}")
    if input_len is not None:
        raise DFlashError("--input_len", f"fixes the length of random prompts, not of {dataset}",
                          "drop --input_len, or use --dataset random")
    if tokenizer is None:
        raise DFlashError("tokenizer", f"--dataset {dataset} needs the target's tokenizer (chat template)",
                          "add the tokenizer files to the target folder, pass --tokenizer DIR, or use --dataset random")
    from ..data import load_prompts
    items = []
    for prompt in load_prompts(dataset, num_prompts, progress=False):
        text = tokenizer.apply_chat_template(list(prompt.messages), tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False)
        # The same ids as data.apply_chat_template: the rendered template already holds any BOS.
        items.append(WorkItem(tuple(tokenizer(text, add_special_tokens=False)["input_ids"]), text))
    return items


def _random(tokenizer, n: int, input_len: int | None, vocab_size: int | None, seed: int) -> list[WorkItem]:
    if not input_len or input_len < 1:
        raise DFlashError("--input_len", "is required with --dataset random (and must be >= 1)",
                          "pass e.g. --input_len 1024 --max_new_tokens 1024 --ignore_eos")
    vocab = vocab_size or (len(tokenizer) if tokenizer is not None else None)
    if not vocab:
        raise DFlashError("vocab_size", "unknown", "pass the target's tokenizer")
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    allowed = np.array([i for i in range(vocab) if i not in special])
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(n):
        ids = tuple(int(i) for i in rng.choice(allowed, input_len))
        # Endpoints get the decoded text; it may re-tokenize to a slightly different length (as in
        # benchmark_serving); the row records the measured ISL.
        items.append(WorkItem(ids, tokenizer.decode(list(ids)) if tokenizer is not None else None))
    return items


def chunk_token_counts(tokenizer, pieces: list[str]) -> list[int]:
    """Tokens in each streamed text piece: the whole text is tokenized once, and each token is counted in
    the piece where its last character arrived (a token split over two pieces is complete only then)."""
    full = "".join(pieces)
    if not full:
        return [0] * len(pieces)
    if getattr(tokenizer, "is_fast", False):
        offsets = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        ends = np.cumsum([len(p) for p in pieces])
        # piece index holding each token's last character
        owner = np.searchsorted(ends, [max(end, 1) for _, end in offsets], side="left")
        return np.bincount(owner, minlength=len(pieces)).tolist()[: len(pieces)]
    counts, prefix, before = [], "", 0   # slow tokenizers: length of each growing prefix
    for piece in pieces:
        prefix += piece
        now = len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
        counts.append(max(now - before, 0))
        before = max(now, before)
    return counts
