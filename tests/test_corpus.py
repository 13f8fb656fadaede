# SPDX-License-Identifier: Apache-2.0
"""The scaled prompt set: decontamination against HumanEval / MT-Bench (exact and near copies caught, ordinary
prompts and real library code let through), code tasks from real code, the shard files and manifest, and the
sharded regeneration on a tiny chat model: a run cut off by its time budget and resumed gives the same bytes as an
uncut run."""
from __future__ import annotations

import gzip
import json
import sysconfig
from pathlib import Path

import pytest

from trtllm_dflash import train
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.training import corpus, regenerate
from trtllm_dflash.training.decontaminate import Decontaminator, eval_sets, words

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def evals() -> dict[str, str]:
    return eval_sets(progress=False)


@pytest.fixture(scope="module")
def deco(evals) -> Decontaminator:
    return Decontaminator(evals)


def test_every_eval_prompt_is_caught_verbatim_and_reformatted(deco, evals):
    assert len(evals) == 164 + 160 and len(deco) == len(evals)
    for eid, text in evals.items():
        hit = deco.match(text)  # HumanEval/56 and /61 differ only in bracket characters: either may be named
        assert hit.coverage == 1.0 and words(evals[hit.eval_id]) == words(text), eid
        assert deco.match("  " + text.upper().replace("\n", " \n\t ") + " ") is not None, eid


def test_near_copies_are_caught(deco, evals):
    he0 = evals["HumanEval/0"]
    renamed = he0.replace("has_close_elements", "any_two_close").replace("threshold", "limit")
    wrapped = f"Implement this Python function:\n```python\n{renamed}\n```\nUse a double loop."
    assert deco.match(wrapped).eval_id == "HumanEval/0"
    edited = he0.replace("Check if in given list of numbers", "Tell whether in a list of floats")
    assert deco.match(edited).eval_id == "HumanEval/0"
    half = he0[: len(he0) // 2]  # a piece of an eval prompt
    assert deco.match(half).eval_id == "HumanEval/0"
    mt = evals["mtbench/81/turn1"]
    assert deco.match(f"Hi! {mt.replace('Hawaii', 'Japan')} Thanks a lot.").eval_id == "mtbench/81/turn1"
    short = next(eid for eid, t in evals.items() if len(t.split()) < 6)  # exact-only rule for short turns
    assert deco.match(evals[short].lower() + "!").eval_id == short
    assert deco.match(f"{evals[short]} And then tell me about your day in detail please.") is None


def test_ordinary_prompts_and_library_code_pass(deco):
    ordinary = ["Write a Python function that returns the sum of a list.", "What is the capital of France?",
                "Compose a short poem about autumn leaves falling in the park.",
                "def parse(s):\n    \"\"\"Parse a config string into a dict of key/value pairs.\"\"\"\n    ...",
                "Now make it concise and add a title.", "what is the name of the game?"]
    assert [deco.match(t) for t in ordinary] == [None] * len(ordinary)
    # Real stdlib docstrings share phrasing with HumanEval ("Return the number of ...") yet are no copies.
    root = Path(sysconfig.get_paths()["stdlib"])
    items = corpus.code_items({"stdlib": root / "json"}, per_package=200, seed=0, progress=False)
    items += corpus.code_items({"stdlib": root / "collections"}, per_package=200, seed=0, progress=False)
    assert len(items) >= 20
    assert [it.id for it in items if deco.match(it.messages[0]["content"])] == []


def test_code_tasks_from_real_functions(tmp_path):
    pkg = tmp_path / "site" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text('''
import functools

class Stack:
    @functools.lru_cache
    def peek_all(self, depth: int = 1) -> list:
        """Return the top ``depth`` items of the stack without removing them, newest first."""
        items = list(self._items)
        return items[::-1][:depth]

def _private(x):
    """A private helper that must not become a task, however well documented."""
    y = x
    return y

def short(x):
    """Too short."""
    return x
''')
    items = corpus.code_items({"site:purelib": tmp_path / "site"}, per_package=10, seed=0, progress=False)
    assert len(items) == 1
    it = items[0]
    assert it.id.startswith("code/mypkg.mod:Stack.peek_all/") and it.source == "code"
    shape = it.id.rsplit("/", 1)[1]
    text = it.messages[0]["content"]
    for s in corpus._SHAPES:  # every shape renders from this function
        body = corpus._task(s, *_fn(pkg / "mod.py"))
        assert "peek_all" in body and ("newest first" in body or "items[::-1]" in body), s
    assert text == corpus._task(shape, *_fn(pkg / "mod.py"))
    impl = corpus._task("implement", *_fn(pkg / "mod.py"))
    assert "def peek_all(self, depth: int = 1) -> list:" in impl and "lru_cache" not in impl
    assert "items[::-1]" not in impl  # the answer is not in the question


def _fn(path):
    import ast
    src = path.read_text()
    tree = ast.parse(src)
    return tree.body[1].body[0], src


def _items(n: int = 12) -> list[corpus.Item]:
    words = ["cat", "dog", "sun", "sea", "red", "sky", "owl", "fig", "ink", "jam", "kit", "log"]
    out = [corpus.Item(f"t{i}", "test", ({"role": "user", "content": f"Repeat the word {words[i]} {i + 2} times."},))
           for i in range(n)]
    return out


def test_build_dedups_decontaminates_fits_and_shards(tmp_path, deco, evals):
    from tests.bench_acceptance.tiny_chat import write_tokenizer
    from transformers import AutoTokenizer

    write_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    conv = corpus.Item("long", "test", ({"role": "user", "content": "x" * 300}, {"role": "assistant", "content":
                                        "y" * 300}, {"role": "user", "content": "Now shorter."}))
    items = _items() + [corpus.Item("dup", "test", ({"role": "user", "content": "REPEAT the word cat 2 times"},)),
                        corpus.Item("copy", "test", ({"role": "user", "content": evals["mtbench/81/turn1"]},)),
                        corpus.Item("huge", "test", ({"role": "user", "content": "z" * 400},)), conv]
    s = corpus.CorpusSettings(max_prompt_len=200, shard_size=5, sampled_share=0.5)
    m = corpus.build(tmp_path / "c", s, items=items, tokenizer=tok, decontaminator=deco, progress=False,
                     log=lambda *_: None)
    c = m["counts"]
    assert (c["duplicate_test"], c["eval_copy_test"], c["too_long_test"], c["context_trimmed_test"]) == (1, 1, 1, 1)
    assert c["kept"] == 13 and [sh["prompts"] for sh in m["shards"]] == [5, 5, 3]
    assert m["eval_copies"][0]["id"] == "copy" and m["eval_copies"][0]["eval_id"] == "mtbench/81/turn1"
    rows = [r for sh in m["shards"] for r in corpus.read_shard(tmp_path / "c", sh)]
    assert sorted(r["id"] for r in rows) == sorted([f"t{i}" for i in range(12)] + ["long"])
    assert next(r for r in rows if r["id"] == "long")["messages"] == [{"role": "user", "content": "Now shorter."}]
    temps = {r["temperature"] for r in rows}
    assert temps == {0.0, 1.0} and c["sampled"] == sum(r["temperature"] > 0 for r in rows)
    again = corpus.build(tmp_path / "c2", s, items=items, tokenizer=tok, decontaminator=deco, progress=False,
                         log=lambda *_: None)
    assert [sh["sha256"] for sh in again["shards"]] == [sh["sha256"] for sh in m["shards"]]  # reproducible
    said = corpus.describe(tmp_path / "c")   # what a drafter's config.json says of its data: no host path
    assert "13 prompts in 3 shards" in said and str(tmp_path) not in said
    sub = corpus.subset(tmp_path / "c", tmp_path / "sub", 7, 3)  # the smoke runs' small corpus
    assert [sh["prompts"] for sh in sub["shards"]] == [3, 3, 1]
    assert [r for sh in sub["shards"] for r in corpus.read_shard(tmp_path / "sub", sh)] == rows[:7]
    (tmp_path / "c" / m["shards"][1]["name"]).write_bytes(gzip.compress(b'{"id": "tampered"}\n'))
    with pytest.raises(DFlashError, match="does not match its sha256"):
        corpus.read_shard(tmp_path / "c", m["shards"][1])
    with pytest.raises(DFlashError, match="is not empty"):
        corpus.build(tmp_path / "c", s, items=items, tokenizer=tok, decontaminator=deco, progress=False)


COMMON = ["--block_size", "8", "--num_layers", "2", "--target_layer_ids", "0", "2", "--max_new_tokens", "12",
          "--regen_batch_size", "4", "--device", "cpu", "--quiet", "--stages", "regenerate"]


def test_sharded_regeneration_cut_and_resumed_equals_uncut(tmp_path, deco):
    from tests.bench_acceptance.tiny_chat import write_tiny_chat_target
    from transformers import AutoTokenizer

    target = write_tiny_chat_target(tmp_path / "target")
    tok = AutoTokenizer.from_pretrained(str(target))
    s = corpus.CorpusSettings(max_prompt_len=128, shard_size=3, sampled_share=0.5)
    corpus.build(tmp_path / "c", s, items=_items(), tokenizer=tok, decontaminator=deco, progress=False,
                 log=lambda *_: None)
    base = ["--target", target, "--data", tmp_path / "c", *COMMON]
    assert train.main([str(a) for a in base + ["--out", tmp_path / "whole", "--num_prompts", "9"]]) == 0
    whole = json.loads((tmp_path / "whole" / "data" / regenerate.MANIFEST).read_text())["shards"]
    assert sorted(whole) == ["prompts-00000.jsonl.gz", "prompts-00001.jsonl.gz", "prompts-00002.jsonl.gz"]
    # A corpus carried in windows: with its second shard absent, a call answers the first and stops there.
    win = tmp_path / "window"
    win.mkdir()
    for f in ["manifest.json", "prompts-00000.jsonl.gz"]:
        (win / f).write_bytes((tmp_path / "c" / f).read_bytes())
    wargs = ["--target", target, "--data", win, *COMMON, "--out", tmp_path / "w", "--num_prompts", "9"]
    assert train.main([str(a) for a in wargs]) == 0
    assert list(json.loads((tmp_path / "w" / "data" / regenerate.MANIFEST).read_text())["shards"]) == [
        "prompts-00000.jsonl.gz"]
    # A budget that any shard overruns: every call answers exactly one shard, then stops.
    cut = ["--out", tmp_path / "cut", "--num_prompts", "9", "--regen_time_budget_s", "1e-6"]
    for calls in range(1, 4):
        assert train.main([str(a) for a in base + cut + (["--resume"] if calls > 1 else [])]) == 0
        done = json.loads((tmp_path / "cut" / "data" / regenerate.MANIFEST).read_text())["shards"]
        assert len(done) == calls
        assert regenerate.is_done(train.config_from_args([str(a) for a in base + cut])) == (calls == 3)
    assert {k: v["sha256"] for k, v in done.items()} == {k: v["sha256"] for k, v in whole.items()}
    cfg = train.config_from_args([str(a) for a in base + cut])
    rows = regenerate.load_rows(cfg)
    assert len(rows) == 9 and all(len(r["loss_mask"]) == len(r["input_ids"]) for r in rows)
    assert {r["temperature"] for r in rows} == {0.0, 1.0}
    assert all(sum(r["loss_mask"]) == len(r["input_ids"]) - r["prompt_len"] > 0 for r in rows)
    # --regen_total_s: once the answered shards took that long (over calls), the data set is those shards.
    closed = ["--out", tmp_path / "closed", "--num_prompts", "9", "--regen_total_s", "1e-6",
              "--regen_time_budget_s", "1e-6"]
    for calls in range(1, 3):
        assert train.main([str(a) for a in base + closed + (["--resume"] if calls > 1 else [])]) == 0
    ccfg = train.config_from_args([str(a) for a in base + closed])
    assert regenerate.is_done(ccfg) and len(regenerate.read_manifest(ccfg)["shards"]) == 1
    assert regenerate.load_rows(ccfg) == rows[:3]
    # The run travels as a few bounded files and arrives sha256-checked (a fresh GPU host, or shards coming back).
    from trtllm_dflash.training import bundle
    files, parts = bundle.pack_regen(tmp_path / "cut", None, tmp_path / "in", part=0, max_files=2)
    assert parts == 1 and sorted(f.name for f in files) == ["manifest.json", "regen-part0.tar", "train_config.json"]
    got = bundle.unpack(tmp_path / "in", tmp_path / "copy")
    assert got["shards"] == 3 and got["shards_missing"] == []
    assert regenerate.load_rows(train.config_from_args([str(a) for a in base + cut[:-2] + ["--out", tmp_path /
                                                                                            "copy"]])) == rows
    one = {"shards": {k: v for k, v in done.items() if k == "prompts-00000.jsonl.gz"}}
    (tmp_path / "before.json").write_text(json.dumps(one))
    files, _ = bundle.pack_regen(tmp_path / "cut", tmp_path / "before.json", tmp_path / "back")
    import tarfile
    with tarfile.open(tmp_path / "back" / "regen-part0.tar") as t:
        assert sorted(t.getnames()) == ["shards/regen-00001.jsonl.gz", "shards/regen-00002.jsonl.gz"]
    shard = tmp_path / "cut" / "data" / done["prompts-00001.jsonl.gz"]["file"]
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(DFlashError, match="does not match its sha256"):
        regenerate.load_rows(cfg)


def test_more_answers_per_prompt_keep_the_first_and_sample_the_rest(tmp_path, deco):
    """--regen_samples 3: each prompt's first answer is byte for byte the one --regen_samples 1 writes (same seed,
    its own temperature), then two answers at T=1 with seeds of their own, ids ``pid#1`` and ``pid#2``."""
    from tests.bench_acceptance.tiny_chat import write_tiny_chat_target
    from transformers import AutoTokenizer

    target = write_tiny_chat_target(tmp_path / "target")
    tok = AutoTokenizer.from_pretrained(str(target))
    corpus.build(tmp_path / "c", corpus.CorpusSettings(max_prompt_len=128, shard_size=4, sampled_share=0.5),
                 items=_items(4), tokenizer=tok, decontaminator=deco, progress=False, log=lambda *_: None)
    base = ["--target", target, "--data", tmp_path / "c", "--num_prompts", "4", *COMMON]
    runs = {}
    for k in (1, 3):
        assert train.main([str(a) for a in base + ["--out", tmp_path / f"k{k}", "--regen_samples", k]]) == 0
        runs[k] = regenerate.load_rows(train.config_from_args([str(a) for a in base + ["--out", tmp_path / f"k{k}"]]))
    one, three = runs[1], runs[3]
    assert len(one) == 4 and len(three) == 12
    assert [r for r in three if "#" not in r["id"]] == one
    extra = [r for r in three if "#" in r["id"]]
    assert sorted(r["id"] for r in extra) == sorted(f"{r['id']}#{k}" for r in one for k in (1, 2))
    assert {r["temperature"] for r in extra} == {1.0}
    by_id = {r["id"]: r["input_ids"] for r in three}
    # sampled answers differ from each other (seeds of their own), on a random tiny target all but surely
    assert any(by_id[f"{r['id']}#1"] != by_id[f"{r['id']}#2"] for r in one)
    with pytest.raises(DFlashError, match="--regen_samples"):
        train.config_from_args([str(a) for a in base + ["--out", tmp_path / "x", "--regen_samples", "0"]])
