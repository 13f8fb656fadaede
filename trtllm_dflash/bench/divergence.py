# SPDX-License-Identifier: Apache-2.0
"""The bf16 tolerance policy for "greedy DFlash == greedy AR", shared by tests/gpu and cuda_check.py.

A bf16 verify of 16 tokens and a bf16 step of 1 token run different GEMM shapes, which round differently;
where the target's two best tokens are nearly tied, the two runs may pick different ones, and from there the
sequences legitimately differ. So in bf16 the two outputs must be equal up to their first divergence, and a
divergence is accepted only at a near-tie of the float32 target: the two diverging tokens ARE the float32
target's top 2, and their float32 logits differ by less than MARGIN_BOUND. A token outside the float32 top 2
is never excused, however close its logit. Float32 has no such allowance: it must be exact. Nor has bf16 on the batch-invariant kernels (RuntimeConfig.
batch_invariant on the Triton path, a row recorded with ``batch_invariant``): there a row's rounding does not
depend on the block or the batch, so the outputs must be exact (POLICY["bfloat16 batch-invariant"]).

:func:`judge` decides from the recorded float32 numbers alone, so a results file can be re-checked without the
model (``python -m trtllm_dflash.bench.cuda_check --rejudge FILE``; tests/test_divergence_policy.py checks the committed one).
"""
from __future__ import annotations

import torch

# logits of SmolLM2-135M span ~30; bf16 keeps 8 significant bits, so a 135M model's bf16 logits carry
# errors of a few tenths after 30 layers. A margin below 0.5 is within that noise.
MARGIN_BOUND = 0.5
POLICY = {"float32": "float32: exact",
          "bfloat16": f"bf16: equal up to a first divergence whose two tokens are the float32 top 2 with margin "
                      f"< {MARGIN_BOUND}",
          "bfloat16 batch-invariant": "bf16 on the batch-invariant kernels: exact"}


def policy_key(row: dict) -> str:
    """The POLICY entry a cuda_check SmolLM2 row is judged by: its dtype, and for bf16 whether it ran batch-invariant."""
    return "bfloat16 batch-invariant" if row["dtype"] == "bfloat16" and row.get("batch_invariant") else row["dtype"]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (over the common length), or None when one is a prefix of the other."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def judge(tokens: list[int], f32_top2: list[int], f32_gaps: list[float]) -> dict:
    """The verdict on one divergence from float32 numbers: ``tokens`` the two diverging tokens, ``f32_top2`` the
    float32 target's two best tokens, ``f32_gaps`` each diverging token's float32 logit below the best one.
    The margin is the float32 logit gap between the two tokens actually involved."""
    if len(tokens) != 2 or tokens[0] == tokens[1] or len(f32_top2) != 2 or len(f32_gaps) != 2:
        raise ValueError(f"a divergence is two different tokens with their two gaps and the float32 top 2; got "
                         f"tokens={tokens} f32_top2={f32_top2} f32_gaps={f32_gaps}")
    in_top2 = set(tokens) == set(f32_top2)
    margin = abs(f32_gaps[0] - f32_gaps[1])
    return {"in_f32_top2": in_top2, "f32_margin": round(margin, 4),
            "allowed": in_top2 and margin < MARGIN_BOUND}


@torch.inference_mode()
def near_tie(model, prompt: list[int], prefix: list[int], tok_a: int, tok_b: int) -> dict:
    """The float32 reference's view of a divergence after prompt + prefix: its top-2 tokens and their margin, each
    diverging token's gap below the best logit, and the verdict of :func:`judge`."""
    dev = next(model.parameters()).device
    logits = model(torch.tensor([prompt + prefix], device=dev)).logits[0, -1].double()  # [V]
    top = logits.topk(2)
    top2 = sorted(top.indices.tolist())
    gaps = [round(float(top.values[0] - logits[t]), 4) for t in (tok_a, tok_b)]  # judged as recorded: re-checkable
    return {"position": len(prefix), "tokens": [tok_a, tok_b], "f32_top2": top2,
            "f32_top2_margin": round(float(top.values[0] - top.values[1]), 4), "f32_gaps": gaps,
            **judge([tok_a, tok_b], top2, gaps)}


def policy_met(row: dict) -> bool:
    """Whether one SmolLM2 row of cuda_check (``dtype``, ``n_prompts``, ``dflash_eq_ar_greedy``, ``diverged_at``,
    ``divergences``) meets its dtype's policy, re-judged from its float32 numbers (its own ``allowed`` flags are
    not trusted). bf16: every prompt is equal, or has a recorded divergence that :func:`judge` allows; outputs that
    differ without a divergence (one a prefix of the other) fail."""
    n, equal = row["n_prompts"], row["dflash_eq_ar_greedy"]
    if policy_key(row) != "bfloat16":   # float32, and bf16 on the batch-invariant kernels: exact
        return equal == n and all(v == n for k, v in row.items() if k.startswith("dflash_eq_ar_greedy_"))
    divs = row.get("divergences", [])
    at = [x for x in row.get("diverged_at", []) if x is not None]
    allowed = sum(judge(d["tokens"], d["f32_top2"], d["f32_gaps"])["allowed"] for d in divs)
    return len(divs) == len(at) and equal + allowed == n
