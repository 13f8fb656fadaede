# SPDX-License-Identifier: Apache-2.0
"""The drafter's prompt set at scale, as shards the regenerate stage works through one at a time.

Sources:
  sharegpt  every user turn of the ShareGPT package with the conversation before it (the original assistant
            replies as context; the target answers the last user turn). Consecutive turns of one role are
            joined (ShareGPT splits long messages), leading assistant turns are dropped; the oldest exchanges
            are dropped while the prompt is longer than ``max_prompt_len`` tokens.
  code      functions with a docstring from real code: the Python standard library and the PyPI packages
            installed beside this one, turned into tasks (implement from signature + docstring, write from a
            description, explain, write tests, add type hints). At most ``code_per_package`` per top-level
            package (each stdlib module counts as one), so no single library dominates.

Then: exact duplicates (normalised text) dropped, prompts over ``max_prompt_len`` tokens dropped (or their context
trimmed), HumanEval / MT-Bench copies among the rest dropped (``decontaminate.py``), a seeded shuffle (every shard mixes the sources, so a partly
regenerated set is a fair sample), and shards of ``shard_size`` prompts:

  <dir>/manifest.json            settings, counts, versions, and per shard: name, sha256, prompts
  <dir>/prompts-00000.jsonl.gz   {"id", "source", "messages", "temperature"} per line

``temperature`` is the answer's sampling temperature (0 = greedy), fixed here per prompt from a hash of its id,
so the greedy/sampled mix is part of the data and survives any resume.
"""
from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import multiprocessing
import os
import random
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..checkpoints.manifest import sha256_file
from ..errors import DFlashError, exit_code
from .decontaminate import Decontaminator, eval_sets, words

MANIFEST = "manifest.json"
FORMAT = 1
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
          "bard": "assistant", "assistant": "assistant"}


@dataclass(frozen=True)
class Item:
    id: str
    source: str
    messages: tuple[dict, ...]
    temperature: float = 0.0

    def row(self) -> dict:
        return {"id": self.id, "source": self.source, "messages": list(self.messages), "temperature": self.temperature}


# --------------------------------------------------------------------------- ShareGPT
def sharegpt_items(progress: bool = True) -> list[Item]:
    """One prompt per user turn of every ShareGPT conversation, with the turns before it."""
    from ..data import _complete_json_items, data_file

    out = []
    for i, conv in enumerate(_complete_json_items(data_file("sharegpt", progress=progress), progress)):
        turns: list[dict] = []
        for t in conv.get("conversations") or []:
            role, text = _ROLES.get(str(t.get("from"))), str(t.get("value", "")).strip()
            if role is None or not text or (not turns and role != "user"):
                continue
            if turns and turns[-1]["role"] == role:
                turns[-1] = {"role": role, "content": turns[-1]["content"] + "\n\n" + text}
            else:
                turns.append({"role": role, "content": text})
        cid = str(conv.get("id", i))
        for k in range(0, len(turns), 2):
            out.append(Item(f"sharegpt/{cid}@{i}/t{k // 2}", "sharegpt", tuple(turns[: k + 1])))
    return out


# --------------------------------------------------------------------------- code
_SHAPES = ("implement", "describe", "explain", "tests", "types")


def code_roots() -> dict[str, Path]:
    """{label: folder}: the standard library and site-packages of this interpreter."""
    paths = sysconfig.get_paths()
    roots = {"stdlib": Path(paths["stdlib"])}
    for key in ("purelib", "platlib"):
        p = Path(paths[key])
        if p.is_dir() and p not in roots.values():
            roots[f"site:{key}"] = p
    return roots


def code_items(roots: dict[str, Path], per_package: int, seed: int, progress: bool = True) -> list[Item]:
    """Task prompts from the documented functions under ``roots`` (at most ``per_package`` per package)."""
    from tqdm import tqdm

    by_pkg: dict[str, list[Path]] = {}
    for label, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if label != "stdlib" and (len(rel.parts) < 2 or rel.parts[0].endswith((".dist-info", ".egg-info"))):
                continue  # loose modules and metadata
            if any(p in ("site-packages", "__pycache__") or p.startswith(".") for p in rel.parts):
                continue  # stdlib's site-packages is the other root
            # each stdlib module or package counts as a package of its own (json, asyncio, email, ...)
            pkg = f"stdlib.{rel.parts[0].removesuffix('.py')}" if label == "stdlib" else rel.parts[0]
            by_pkg.setdefault(pkg, []).append(path)
    jobs = [(pkg, by_pkg[pkg], roots, per_package, seed) for pkg in sorted(by_pkg)]
    out = []
    # Two worker processes: parsing is the cost (minutes on 2 cores); results come back in package order.
    if len(jobs) < 8:  # not worth two interpreters
        return [it for job in jobs for it in _package_items(job)]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        for items in tqdm(pool.imap(_package_items, jobs), total=len(jobs), desc="code prompts", unit="package",
                          disable=not progress, file=sys.stderr):
            out += items
    return out


def _package_items(job) -> list[Item]:
    pkg, paths, roots, per_package, seed = job
    funcs, rng = [], random.Random(f"{seed}:{pkg}")
    # Files in a seeded order, parsed until the quota is met: a big package (torch: thousands of files) costs
    # about as much as a small one, and the functions taken are still a seeded sample of the package.
    for path in rng.sample(paths, len(paths)):
        if len(funcs) >= per_package:
            break
        if path.stat().st_size > 200_000:
            continue
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(path.relative_to(_root_of(path, roots)).with_suffix("").parts)
        funcs += [(module, q, f, src) for q, f in _documented_functions(tree)]
    out = []
    for module, qual, fn, src in funcs[:per_package]:
        pid = f"code/{module}:{qual}"
        shape = _SHAPES[int(hashlib.sha256(pid.encode()).hexdigest(), 16) % len(_SHAPES)]
        out.append(Item(f"{pid}/{shape}", "code", ({"role": "user", "content": _task(shape, fn, src)},)))
    return out


def _root_of(path: Path, roots: dict[str, Path]) -> Path:
    return max((r for r in roots.values() if path.is_relative_to(r)), key=lambda r: len(r.parts))


def _documented_functions(tree: ast.Module):
    """(qualified name, node) of public functions and methods with a docstring and a real body."""
    def walk(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                yield from walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                lines = node.end_lineno - node.lineno + 1
                if doc and 40 <= len(doc) <= 1500 and len(node.body) >= 2 and lines <= 80:
                    yield prefix + node.name, node
    yield from walk(tree.body, "")


def _task(shape: str, fn: ast.FunctionDef, src: str) -> str:
    doc = ast.get_docstring(fn)
    header = _signature(fn, src)
    if shape == "implement":
        indent = " " * (fn.col_offset + 4)
        quoted = "\n".join(indent + line if line else "" for line in doc.splitlines())
        return f"Implement this Python function:\n```python\n{header}\n{indent}\"\"\"\n{quoted}\n{indent}\"\"\"\n```"
    if shape == "describe":
        return (f"Write a Python function `{header.strip().removeprefix('async ').removeprefix('def ')[:-1]}`. "
                f"Its documentation says:\n\n{doc}")
    body = ast.get_source_segment(src, fn) or ""
    body = "\n".join(line[fn.col_offset:] for line in body.splitlines())
    if shape == "explain":
        return f"Explain what this Python function does, step by step:\n```python\n{body}\n```"
    if shape == "tests":
        return f"Write pytest unit tests for this function:\n```python\n{body}\n```"
    return f"Add type hints to this function and explain your choices:\n```python\n{body}\n```"


def _signature(fn: ast.FunctionDef, src: str) -> str:
    """``def name(args) -> ret:`` as written in the source (decorators dropped)."""
    seg = ast.get_source_segment(src, fn) or ""
    lines = seg.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "async def ")))
    end = fn.body[0].lineno - fn.lineno
    sig = "\n".join(line[fn.col_offset:] if i else line.lstrip() for i, line in enumerate(lines[start:end]))
    return sig.rstrip()


# --------------------------------------------------------------------------- build
@dataclass(frozen=True)
class CorpusSettings:
    target: str = "smollm2-135m"        # whose tokenizer and chat template measure prompt length
    max_prompt_len: int = 512
    code_per_package: int = 150
    shard_size: int = 1000
    sampled_share: float = 1 / 3        # share of prompts answered with sampling (the rest greedy)
    sampled_temperature: float = 1.0
    seed: int = 0
    sources: tuple[str, ...] = ("sharegpt", "code")

    def __post_init__(self):
        if not 0 <= self.sampled_share <= 1:
            raise DFlashError("--sampled_share", f"must be in [0, 1], got {self.sampled_share}", "use 0.33")
        if self.shard_size <= 0 or self.max_prompt_len <= 0:
            raise DFlashError("--shard_size", "and --max_prompt_len must be > 0", "pass positive numbers")
        bad = [s for s in self.sources if s not in ("sharegpt", "code")]
        if bad:
            raise DFlashError("--sources", f"unknown source {bad[0]!r}", "use sharegpt and/or code")


def build(out: Path, s: CorpusSettings, *, items: list[Item] | None = None, tokenizer=None,
          decontaminator: Decontaminator | None = None, provenance: dict | None = None, progress: bool = True,
          log=print) -> dict:
    """Write the shards and manifest into ``out`` (new or empty); returns the manifest. ``provenance`` (the
    command line passes ``provenance.record()``) goes into the manifest as it is."""
    out = Path(out)
    if out.is_dir() and any(out.iterdir()):
        raise DFlashError("--out", f"{out} is not empty", "pass a new folder (a corpus is written once)")
    if items is None:
        items = []
        if "sharegpt" in s.sources:
            items += sharegpt_items(progress)
        if "code" in s.sources:
            items += code_items(code_roots(), s.code_per_package, s.seed, progress)
    if decontaminator is None:
        decontaminator = Decontaminator(eval_sets(progress=progress))
    if tokenizer is None:
        from ..checkpoints.text import load_tokenizer
        from .target import resolve_target
        tokenizer = load_tokenizer(resolve_target(s.target))
    counts: Counter[str] = Counter()
    counts.update(f"candidates_{it.source}" for it in items)
    kept, seen, excluded = [], set(), []
    for it in items:
        key = hashlib.sha256(" ".join(words("\n".join(m["content"] for m in it.messages))).encode()).digest()
        if key in seen:
            counts[f"duplicate_{it.source}"] += 1
            continue
        seen.add(key)
        kept.append(it)
    fitted = []
    for it in _fit_length(kept, tokenizer, s.max_prompt_len, counts, progress):
        # checked as it will be sent: the user turns left after trimming
        hit = decontaminator.match("\n".join(m["content"] for m in it.messages if m["role"] == "user"))
        if hit is not None:
            counts[f"eval_copy_{it.source}"] += 1
            excluded.append({"id": it.id, "eval_id": hit.eval_id, "coverage": round(hit.coverage, 3),
                             "share": round(hit.share, 3)})
            continue
        fitted.append(it)
    rng = random.Random(s.seed)
    rng.shuffle(fitted)
    fitted = [Item(it.id, it.source, it.messages, _temperature(it.id, s)) for it in fitted]
    out.mkdir(parents=True, exist_ok=True)
    shards = write_shards(out, [it.row() for it in fitted], s.shard_size)
    counts.update(f"kept_{it.source}" for it in fitted)
    counts["kept"] = len(fitted)
    counts["sampled"] = sum(it.temperature > 0 for it in fitted)
    manifest = {"format": FORMAT, "settings": {**s.__dict__, "sources": list(s.sources)}, "counts": dict(counts),
                "eval_copies": excluded, "provenance": provenance, "shards": shards}
    write_json(out / MANIFEST, manifest)
    log(f"corpus: {len(fitted)} prompts in {len(shards)} shards under {out} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
    return manifest


def _fit_length(items: list[Item], tokenizer, max_len: int, counts: Counter, progress: bool) -> list[Item]:
    """Items within ``max_len`` prompt tokens (chat template included), dropping the oldest exchanges of a
    conversation until it fits. Lengths are the sum of per-message token counts plus the template's overhead,
    measured on probe chats; the regenerate stage checks the exact length again."""
    from tqdm import tqdm

    from ..data import apply_chat_template

    if tokenizer is None:
        raise DFlashError("--target", "has no tokenizer to measure prompt lengths", "pass a target with one")
    one = len(apply_chat_template(tokenizer, [{"role": "user", "content": "x"}]))
    three = len(apply_chat_template(tokenizer, [{"role": "user", "content": "x"}, {"role": "assistant",
                                                "content": "x"}, {"role": "user", "content": "x"}]))
    per_msg = (three - one) // 2  # template tokens around one message (its content counted apart)
    base = one - per_msg
    out = []
    step = 2048
    for k in tqdm(range(0, len(items), step), desc="prompt lengths", unit="batch", disable=not progress,
                  file=sys.stderr):
        chunk = items[k: k + step]
        texts = [m["content"] for it in chunk for m in it.messages]
        lens = iter(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
        for it in chunk:
            ls = [next(lens) + per_msg - 1 for _ in it.messages]  # "x" is one token
            msgs = list(it.messages)
            while base + sum(ls) > max_len and len(msgs) > 1:
                msgs, ls = msgs[2:], ls[2:]
            if base + sum(ls) > max_len:
                counts[f"too_long_{it.source}"] += 1
                continue
            counts[f"context_trimmed_{it.source}"] += len(msgs) < len(it.messages)
            out.append(Item(it.id, it.source, tuple(msgs)))
    return out


def _temperature(pid: str, s: CorpusSettings) -> float:
    u = int(hashlib.sha256(f"{s.seed}:{pid}".encode()).hexdigest()[:12], 16) / 16 ** 12
    return s.sampled_temperature if u < s.sampled_share else 0.0


# --------------------------------------------------------------------------- files
def write_gz(path: Path, rows: list[dict]) -> None:
    """Atomically: a temp file beside it, then a rename. mtime 0 so the same rows give the same bytes."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        for r in rows:
            f.write((json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
    os.replace(tmp, path)


def write_shards(out: Path, rows: list[dict], shard_size: int) -> list[dict]:
    """``rows`` as prompts-NNNNN.jsonl.gz files of ``shard_size`` rows in ``out``; returns their manifest entries."""
    shards = []
    for k in range(0, len(rows), shard_size):
        name, part = f"prompts-{k // shard_size:05d}.jsonl.gz", rows[k: k + shard_size]
        write_gz(out / name, part)
        shards.append({"name": name, "sha256": sha256_file(out / name), "prompts": len(part),
                       "sources": dict(Counter(r["source"] for r in part))})
    return shards


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def read_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def is_corpus(path: str | Path) -> bool:
    return Path(path, MANIFEST).is_file()


def load_manifest(path: str | Path) -> dict:
    m = json.loads(Path(path, MANIFEST).read_text())
    if m.get("format") != FORMAT:
        raise DFlashError("--data", f"{path} has corpus format {m.get('format')}, this version reads {FORMAT}",
                          "rebuild it with python -m trtllm_dflash.training.corpus")
    return m


def describe(path: str | Path) -> str:
    """A corpus in words for a drafter's config.json: what it holds and its manifest's digest, not the folder it
    happened to sit in on the training host (a path there means nothing to whoever loads the drafter)."""
    m = load_manifest(path)
    s, c = m["settings"], m["counts"]
    digest = hashlib.sha256(Path(path, MANIFEST).read_bytes()).hexdigest()
    return (f"prompt corpus ({' + '.join(s['sources'])}; {c['kept']} prompts in {len(m['shards'])} shards, "
            f"{c['sampled']} answered at T={s['sampled_temperature']:g}, the rest greedy; <= {s['max_prompt_len']} "
            f"prompt tokens; manifest sha256 {digest[:16]})")


def read_shard(corpus: str | Path, shard: dict) -> list[dict]:
    """A prompt shard's rows, after checking its sha256 against the manifest."""
    path = Path(corpus, shard["name"])
    if not path.is_file():
        raise DFlashError("--data", f"{path} is missing", "copy the whole corpus folder")
    if sha256_file(path) != shard["sha256"]:
        raise DFlashError("--data", f"{path} does not match its sha256 in {MANIFEST}", "copy it again")
    return read_gz(path)


def subset(src: Path, out: Path, n: int, shard_size: int) -> dict:
    """The first ``n`` prompts of corpus ``src`` as a new corpus (smoke runs, quick experiments)."""
    m = load_manifest(src)
    rows = []
    for shard in m["shards"]:
        if len(rows) >= n:
            break
        rows += read_shard(src, shard)
    rows = rows[:n]
    out.mkdir(parents=True, exist_ok=False)
    shards = write_shards(out, rows, shard_size)
    manifest = {**m, "subset_of": {"path": str(src), "prompts": n}, "shards": shards}
    write_json(out / MANIFEST, manifest)
    return manifest


# --------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    d = CorpusSettings()
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.training.corpus",
                                description="Build the drafter's prompt set (ShareGPT turns + code tasks from "
                                            "real code, deduplicated, HumanEval/MT-Bench copies removed) as "
                                            "shards for dflash-train --data DIR.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", required=True, help="new folder for manifest.json + prompts-*.jsonl.gz")
    p.add_argument("--target", default=d.target, help="tokenizer + chat template that measure prompt length")
    p.add_argument("--max_prompt_len", type=int, default=d.max_prompt_len, help="tokens, chat template included")
    p.add_argument("--code_per_package", type=int, default=d.code_per_package,
                   help="code prompts per top-level package (each stdlib module counts as one)")
    p.add_argument("--shard_size", type=int, default=d.shard_size, help="prompts per shard")
    p.add_argument("--sampled_share", type=float, default=d.sampled_share,
                   help="share of prompts answered by sampling at --sampled_temperature (the rest greedy)")
    p.add_argument("--sampled_temperature", type=float, default=d.sampled_temperature)
    p.add_argument("--sources", nargs="+", default=list(d.sources), choices=("sharegpt", "code"))
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--subset_of", metavar="CORPUS", help="instead: the first --limit prompts of this corpus")
    p.add_argument("--limit", type=int, default=16, help="prompts taken by --subset_of")
    a = p.parse_args(argv)
    if a.subset_of:
        m = subset(Path(a.subset_of), Path(a.out), a.limit, a.shard_size)
        print(f"corpus: {sum(s['prompts'] for s in m['shards'])} prompts in {len(m['shards'])} shards under {a.out}")
        return 0
    s = CorpusSettings(a.target, a.max_prompt_len, a.code_per_package, a.shard_size, a.sampled_share,
                       a.sampled_temperature, a.seed, tuple(a.sources))
    from ..provenance import record
    build(Path(a.out), s, provenance=record(), progress=not a.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
