# SPDX-License-Identifier: Apache-2.0
"""bench.workload: prompts from packaged data and random ids; streamed text counted in tokens."""
from __future__ import annotations

import pytest

from trtllm_dflash.bench.workload import chunk_token_counts, load_workload
from trtllm_dflash.errors import DFlashError


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def test_chunk_token_counts_follow_the_stream(tokenizer):
    text = " Paris is the capital of France. Ünïcödé and 中文 too."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # the text as a server streams it, one piece per token; an incomplete character is held back (empty
    # piece), so the token that completes it counts both
    per_token, sent = [], ""
    for i in range(len(ids)):
        now = tokenizer.decode(ids[: i + 1])
        piece = "" if now.endswith("\ufffd") else now[len(sent):]
        per_token.append(piece)
        sent += piece
    assert "".join(per_token) == text and "" in per_token
    counts = chunk_token_counts(tokenizer, per_token)
    assert sum(counts) == len(ids) and set(counts) <= {0, 1, 2, 3}
    assert [c for c, p in zip(counts, per_token) if not p] == [0] * per_token.count("")
    grouped = ["".join(per_token[0:3]), "", "".join(per_token[3:4]), "".join(per_token[4:])]
    assert chunk_token_counts(tokenizer, grouped) == [3, 0, 1, len(ids) - 4]   # the first 4 tokens are ASCII
    # a token whose characters arrive in two pieces counts where its last character arrived
    assert chunk_token_counts(tokenizer, [" Par", "is"]) == [0, 1]
    assert chunk_token_counts(tokenizer, ["", ""]) == [0, 0]


def test_slow_tokenizer_path_agrees(tokenizer):
    class Slow:   # only __call__, like a slow (python) tokenizer without offsets
        is_fast = False

        def __call__(self, text, add_special_tokens=False):
            return tokenizer(text, add_special_tokens=add_special_tokens)

    pieces = [" The", " quick brown", " fox", " jumps."]
    assert chunk_token_counts(Slow(), pieces) == chunk_token_counts(tokenizer, pieces)


def test_random_prompts_are_fixed_length_and_reproducible(tokenizer):
    a = load_workload("random", tokenizer, num_prompts=3, input_len=32, seed=7)
    b = load_workload("random", tokenizer, num_prompts=3, input_len=32, seed=7)
    assert a == b and len(a) == 3 and all(len(it.prompt_ids) == 32 for it in a)
    assert not set(tokenizer.all_special_ids) & {i for it in a for i in it.prompt_ids}
    assert all(isinstance(it.text, str) and it.text for it in a)
    ids_only = load_workload("random", None, num_prompts=2, input_len=5, vocab_size=96)
    assert all(it.text is None and max(it.prompt_ids) < 96 for it in ids_only)


def test_packaged_dataset_with_chat_template(tokenizer):
    items = load_workload("humaneval", tokenizer, num_prompts=2)
    assert len(items) == 2 and items[0].text.startswith("<|im_start|>")
    assert "Write a solution to the following problem" in items[0].text
    assert list(items[0].prompt_ids) == tokenizer(items[0].text, add_special_tokens=False)["input_ids"]


def test_workload_errors(tokenizer):
    with pytest.raises(DFlashError, match="--input_len: is required with --dataset random"):
        load_workload("random", tokenizer, num_prompts=1)
    with pytest.raises(DFlashError, match="--input_len: fixes the length of random prompts, not of mtbench"):
        load_workload("mtbench", tokenizer, num_prompts=1, input_len=8)
    with pytest.raises(DFlashError, match="tokenizer: --dataset humaneval needs the target's tokenizer"):
        load_workload("humaneval", None, num_prompts=1)
