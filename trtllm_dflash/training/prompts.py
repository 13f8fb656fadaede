# SPDX-License-Identifier: Apache-2.0
"""Where training prompts come from, minus every prompt that is also in an evaluation set.

``--data sharegpt``: ShareGPT first user turns (``trtllm_dflash.data``). ``--data FILE.jsonl``: one JSON object per
line with ``prompt`` (text), ``messages`` (a chat; turns after the last user turn are dropped, since the target
writes the reply) or ``prompt_ids`` (token ids, sent as they are; no tokenizer needed). An ``id`` field is kept.

Held apart from evaluation: a prompt is dropped when, after lower-casing and collapsing whitespace, it equals a
HumanEval or MT-Bench prompt (either turn), contains one of at least ``_MIN_OVERLAP`` characters, or is itself such
a long piece of one. Token-id prompts have no text and are not checked (the count is reported).
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from ..data import HUMANEVAL_TEMPLATE, load_prompts
from ..errors import DFlashError

_MIN_OVERLAP = 40  # characters; shorter eval texts ("Now make it concise.") only count as exact matches


@dataclass(frozen=True)
class Source:
    """One training prompt: ``messages`` (a chat) or ``prompt_ids`` (pre-tokenised), never both."""

    id: str
    messages: tuple[dict, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None

    @property
    def text(self) -> str | None:
        return None if self.messages is None else "\n".join(m["content"] for m in self.messages)


def load_sources(data: str, *, cache_dir=None, progress: bool = True) -> list[Source]:
    """All prompts of ``data`` ("sharegpt" or a .jsonl path), in file order."""
    if data == "sharegpt":
        return [Source(p.id, messages=p.messages) for p in load_prompts("sharegpt", cache_dir=cache_dir,
                                                                        progress=progress)]
    path = Path(data).expanduser()
    if not path.is_file():
        raise DFlashError("--data", f"{data} is neither 'sharegpt' nor a file", "pass sharegpt or a .jsonl file")
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                out.append(_parse_row(line, n, path))
    if not out:
        raise DFlashError("--data", f"{path} has no rows", "write one JSON object per line")
    return out


def _parse_row(line: str, n: int, path: Path) -> Source:
    where = f"--data {path.name}:{n}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise DFlashError(where, f"is not JSON ({err.msg})", "write one JSON object per line") from None
    pid = str(row.get("id", n))
    if isinstance(row.get("prompt_ids"), list) and row["prompt_ids"]:
        return Source(pid, prompt_ids=tuple(int(i) for i in row["prompt_ids"]))
    if isinstance(row.get("prompt"), str) and row["prompt"].strip():
        return Source(pid, messages=({"role": "user", "content": row["prompt"]},))
    msgs = row.get("messages")
    if isinstance(msgs, list) and any(m.get("role") == "user" for m in msgs):
        last_user = max(i for i, m in enumerate(msgs) if m.get("role") == "user")
        return Source(pid, messages=tuple({"role": m["role"], "content": m["content"]} for m in msgs[: last_user + 1]))
    raise DFlashError(where, "has no prompt_ids, prompt or messages with a user turn",
                      'use {"prompt": "..."}, {"messages": [{"role": "user", "content": "..."}]} '
                      'or {"prompt_ids": [...]}')


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def eval_texts(*, cache_dir=None, progress: bool = True) -> list[str]:
    """Normalised HumanEval prompts (the raw code and the templated message) and MT-Bench turns."""
    head, tail = HUMANEVAL_TEMPLATE.split("{prompt}")
    texts = []
    for p in load_prompts("humaneval", cache_dir=cache_dir, progress=progress):
        msg = p.messages[0]["content"]
        texts += [msg, msg[len(head): len(msg) - len(tail)]]
    for p in load_prompts("mtbench", turn=2, cache_dir=cache_dir, progress=progress):
        texts += [m["content"] for m in p.messages]
    return sorted({_norm(t) for t in texts if t.strip()})


def overlaps(text: str, evals: list[str]) -> bool:
    t = _norm(text)
    return any(t == e or (len(e) >= _MIN_OVERLAP and e in t) or (len(t) >= _MIN_OVERLAP and t in e) for e in evals)


def select(sources: list[Source], seed: int, evals: list[str] | None) -> tuple[list[Source], dict]:
    """``sources`` without the eval overlaps, in a seeded shuffle, plus counts for the report. Every prompt is
    checked (not only those used), so the report says how many overlaps the data holds."""
    counts = {"available": len(sources), "excluded_eval_overlap": 0, "not_checked_token_ids": 0}
    kept = []
    for s in sources:
        if evals is not None and s.text is not None and overlaps(s.text, evals):
            counts["excluded_eval_overlap"] += 1
            continue
        counts["not_checked_token_ids"] += evals is not None and s.text is None
        kept.append(s)
    random.Random(seed).shuffle(kept)
    return kept, counts
