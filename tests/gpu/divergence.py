# SPDX-License-Identifier: Apache-2.0
"""The bf16 tolerance policy for "greedy DFlash == greedy AR", shared by tests/gpu and benchmarks/cuda_check.py.

A bf16 verify of 16 tokens and a bf16 step of 1 token run different GEMM shapes, which round differently;
where the target's two best tokens are nearly tied, the two runs may pick different ones, and from there the
sequences legitimately differ. So in bf16 the two outputs must be equal up to their first divergence, and a
divergence is accepted only at a near-tie of the float32 target: both tokens' float32 logits lie within
MARGIN_BOUND of its best logit (two, or at a three-way tie three, candidates that bf16 noise can reorder; a
token the float32 target ranks clearly lower is never excused). Float32 has no such allowance: it must be exact.
"""
from __future__ import annotations

import torch

# logits of SmolLM2-135M span ~30; bf16 keeps 8 significant bits, so a 135M model's bf16 logits carry
# errors of a few tenths after 30 layers. A margin below 0.5 is within that noise.
MARGIN_BOUND = 0.5


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (over the common length), or None when one is a prefix of the other."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@torch.inference_mode()
def near_tie(model, prompt: list[int], prefix: list[int], tok_a: int, tok_b: int) -> dict:
    """The float32 reference's view of a divergence after prompt + prefix: its top-2 tokens and margin, each
    diverging token's gap below the best logit, and whether both gaps are under MARGIN_BOUND."""
    dev = next(model.parameters()).device
    logits = model(torch.tensor([prompt + prefix], device=dev)).logits[0, -1].double()  # [V]
    top = logits.topk(2)
    margin = float(top.values[0] - top.values[1])
    top2 = sorted(top.indices.tolist())
    gaps = [float(top.values[0] - logits[t]) for t in (tok_a, tok_b)]
    return {"position": len(prefix), "tokens": [tok_a, tok_b], "f32_top2": top2, "f32_margin": round(margin, 4),
            "f32_gaps": [round(g, 4) for g in gaps], "allowed": max(gaps) < MARGIN_BOUND}
