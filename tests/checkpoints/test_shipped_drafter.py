# SPDX-License-Identifier: Apache-2.0
"""The SmolLM2 drafter that ships in trtllm_dflash/drafters: found by its short name, small, marked trained, and
really trained: lossless against the real target and accepting well above an untrained drafter's ~1.0."""
from __future__ import annotations

import pytest

from trtllm_dflash.checkpoints import hf, resolve

pytestmark = pytest.mark.usefixtures("one_torch_thread")
QUESTIONS = ["Write a Python function that checks whether a number is prime.",
             "What are the main causes of climate change?", "Explain how a hash table works.",
             "Give me three tips for a job interview."]


def test_short_name_resolves_to_the_shipped_folder():
    assert resolve.expand_short_name("smollm2-135m", None)[1] == "smollm2-135m-dflash"
    res = resolve.resolve("smollm2-135m-dflash", role="drafter", download=False)   # no network, even in a dry run
    assert res.kind == "packaged" and res.path == resolve.shipped_drafter_dir("smollm2-135m-dflash")
    cfg = hf.read_config(res.path)
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_trained"] and cfg["block_size"] == 16
    assert cfg["dflash_config"] == {"mask_token_id": 16, "target_layer_ids": [1, 14, 27]}
    assert sum(f.stat().st_size for f in res.path.iterdir()) < 50e6   # the "well under 50 MB"


@pytest.mark.slow
def test_shipped_drafter_is_lossless_and_accepts():
    from trtllm_dflash.checkpoints import packaged
    from trtllm_dflash.config import RuntimeConfig, SamplingParams
    from trtllm_dflash.data import apply_chat_template
    from trtllm_dflash.runtime.engine import Engine

    target = packaged.smollm2_target_dir()
    dflash = Engine.from_dirs(target, resolve.shipped_drafter_dir("smollm2-135m-dflash"),
                              RuntimeConfig(max_batch_size=4, max_seq_len=1024))
    prompts = [apply_chat_template(dflash.tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=48)
    got = dflash.generate(prompts, params)
    ar = Engine.from_dirs(target, None, RuntimeConfig(max_batch_size=4, max_seq_len=1024, block_size=1))
    assert [r.output_ids for r in got] == [r.output_ids for r in ar.generate(prompts, params)]
    lengths = [k for r in got for k in r.stats.acceptance_lengths]
    # Measured 1.53 here (float32 CPU); an untrained drafter gives ~1.0.
    assert sum(lengths) / len(lengths) > 1.25
