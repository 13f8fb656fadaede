# SPDX-License-Identifier: Apache-2.0
"""Greedy DFlash == greedy AR on the real SmolLM2-135M-Instruct with the shipped (trained) drafter, on CUDA:
exact in float32; in bf16 exact too on the Triton kernels in the batch-invariant mode (RuntimeConfig.
batch_invariant, asked for here): every prompt at blocks 16, 8 and 4 and under the adaptive policy, greedy and
seeded T = 1, and each prompt's answer alone == among the 8. The torch path on CUDA (cuBLAS, SDPA: no invariant
mode) stays under the policy in trtllm_dflash/bench/divergence.py (equal up to the first divergence, which must be a
float32 near-tie). The divergence positions and margins are attached to the test report.

Needs the converted SmolLM2 ($TRTLLM_DFLASH_CACHE; `bash benchmarks/gpu_smollm2.sh prep` on the GPU host)."""
from __future__ import annotations

import pytest
import torch

from trtllm_dflash.bench.divergence import MARGIN_BOUND, first_divergence, near_tie
from trtllm_dflash.checkpoints.resolve import shipped_drafter_dir
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from tests.runtime.kernel_engine import engine_with_kernel

pytestmark = pytest.mark.gpu
QUESTIONS = ["What is the capital of France?", "Write a Python function that returns the sum of a list.",
             "Explain speculative decoding in two sentences.", "List three prime numbers greater than 100.",
             "Translate 'good morning' into Spanish and German.", "What does a GPU do?",
             "Write a haiku about the sea.", "How many legs does a spider have?"]
MAX_NEW = 128


@pytest.fixture(scope="module")
def pair(smollm2_dir):
    return smollm2_dir, shipped_drafter_dir("smollm2-135m-dflash")


@pytest.fixture(scope="module")
def prompt_ids(pair):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(pair[0]))
    return [tok(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False),
                add_special_tokens=False)["input_ids"] for q in QUESTIONS]


def generate(pair, prompt_ids, dtype, kernel="torch", sp=SamplingParams(max_new_tokens=MAX_NEW), **df_cfg):
    cfg = dict(max_seq_len=1024, max_batch_size=8, dtype=dtype, device="cuda", kernels=kernel,
               batch_invariant=kernel == "triton")
    ar = engine_with_kernel(pair[0], None, RuntimeConfig(block_size=1, **cfg))
    df = engine_with_kernel(pair[0], pair[1], RuntimeConfig(**{**cfg, **df_cfg}))
    return ar.generate(prompt_ids, sp), df.generate(prompt_ids, sp)


def assert_identical(a, d, record_property) -> None:
    diverged = {i: first_divergence(x.output_ids, y.output_ids) for i, (x, y) in enumerate(zip(a, d))
                if x.output_ids != y.output_ids}
    record_property("identical", len(a) - len(diverged))
    assert not diverged, f"bf16 in the batch-invariant mode must be exact; prompt: first divergence {diverged}"


@pytest.mark.parametrize("kernel", ["torch", "triton"])   # RuntimeConfig.kernels
def test_greedy_dflash_equals_ar_in_float32(pair, prompt_ids, record_property, kernel):
    a, d = generate(pair, prompt_ids, "float32", kernel)
    tau = sum(r.stats.tau for r in d) / len(d)
    record_property("tau", round(tau, 3))
    assert tau > 1.2, f"tau {tau:.2f}: the trained drafter should be accepted often, or this test checks little"
    for i, (x, y) in enumerate(zip(a, d)):
        assert y.output_ids == x.output_ids, f"prompt {i}: first divergence at {first_divergence(x.output_ids, y.output_ids)}"


@pytest.mark.parametrize("block", [16, 8, 4])
def test_greedy_dflash_equals_ar_in_bf16_batch_invariant(pair, prompt_ids, record_property, block):
    a, d = generate(pair, prompt_ids, "bfloat16", "triton", block_size=block)
    assert_identical(a, d, record_property)


def test_greedy_dflash_equals_ar_in_bf16_batch_invariant_adaptive(pair, prompt_ids, record_property):
    cfg = dict(max_seq_len=1024, max_batch_size=8, dtype="bfloat16", device="cuda", kernels="triton",
               batch_invariant=True)
    ar = engine_with_kernel(pair[0], None, RuntimeConfig(block_size=1, **cfg))
    df = engine_with_kernel(pair[0], pair[1], RuntimeConfig(**cfg))
    df.use_adaptive_policy()
    sp = SamplingParams(max_new_tokens=MAX_NEW)
    a, d = ar.generate(prompt_ids, sp), df.generate(prompt_ids, sp)
    record_property("block_counts", df.block_counts)
    assert_identical(a, d, record_property)


def test_seeded_dflash_equals_seeded_ar_in_bf16_batch_invariant(pair, prompt_ids, record_property):
    sps = [SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0, seed=s) for s in range(len(prompt_ids))]
    a, d = generate(pair, prompt_ids, "bfloat16", "triton", sps)
    assert_identical(a, d, record_property)


@pytest.mark.parametrize("block_size", [1, None])
def test_bf16_answer_alone_equals_the_answer_among_others(pair, prompt_ids, record_property, block_size):
    cfg = dict(max_seq_len=1024, max_batch_size=8, dtype="bfloat16", device="cuda", kernels="triton",
               block_size=block_size, batch_invariant=True)
    eng = engine_with_kernel(pair[0], pair[1], RuntimeConfig(**cfg))
    sp = SamplingParams(max_new_tokens=MAX_NEW)
    together = eng.generate(prompt_ids, sp)
    alone = [eng.generate([p], sp)[0] for p in prompt_ids]
    assert_identical(alone, together, record_property)


def test_greedy_dflash_vs_ar_in_bf16_within_the_tolerance_policy(pair, prompt_ids, record_property):
    """The torch path on CUDA: no batch-invariant mode there."""
    from transformers import AutoModelForCausalLM
    a, d = generate(pair, prompt_ids, "bfloat16", "torch")
    ref = AutoModelForCausalLM.from_pretrained(str(pair[0]), dtype=torch.float32).cuda().eval()
    report = []
    for i, (p, x, y) in enumerate(zip(prompt_ids, a, d)):
        at = first_divergence(x.output_ids, y.output_ids)
        if at is None:
            assert x.output_ids == y.output_ids, f"prompt {i}: equal prefix, different lengths"
            continue
        report.append({"prompt": i, **near_tie(ref, p, x.output_ids[:at], x.output_ids[at], y.output_ids[at])})
    record_property("identical", len(prompt_ids) - len(report))
    record_property("divergences", report)
    record_property("margin_bound", MARGIN_BOUND)
    bad = [r for r in report if not r["allowed"]]
    assert not bad, (f"divergences that are not float32 near-ties (the two tokens must be the float32 top 2, their "
                     f"logits less than {MARGIN_BOUND} apart): {bad}")
