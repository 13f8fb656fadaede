# SPDX-License-Identifier: Apache-2.0
"""Tensor-parallel sharding rules, by Hugging Face tensor name (target and drafter alike).

column (dim 0): q/k/v and gate/up projections, split by heads / channels;
row (dim 1): o and down projections (their outputs are all-reduced);
vocab (dim 0, padded to equal shards): lm_head; everything else (norms, embeddings, ``fc``) replicated.
"""
from __future__ import annotations

import torch

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")


def shard_dim(name: str) -> int | str | None:
    """0 or 1 for a split dim, "vocab" for lm_head, None when replicated."""
    parts = name.split(".")
    if name == "lm_head.weight":
        return "vocab"
    if len(parts) >= 2 and parts[-2] in _COLUMN:
        return 0
    if len(parts) >= 2 and parts[-2] in _ROW and parts[-1] == "weight":
        return 1
    return None


def slice_for_rank(name: str, t, tp_size: int, rank: int, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """This rank's part of tensor ``t`` (a tensor or a safetensors lazy slice, which reads only that part)."""
    shape = tuple(t.shape) if shape is None else shape
    dim = shard_dim(name)
    if tp_size == 1 or dim is None:
        return t[:] if not isinstance(t, torch.Tensor) else t
    if dim == "vocab":
        per = -(-shape[0] // tp_size)
        lo, hi = min(rank * per, shape[0]), min((rank + 1) * per, shape[0])
        part = t[lo:hi]
        if hi - lo < per:  # the last rank's rows past the vocabulary are zeros (their logits are dropped)
            part = torch.cat([part, part.new_zeros(per - (hi - lo), *shape[1:])])
        return part
    per = shape[dim] // tp_size
    assert per * tp_size == shape[dim], f"{name}: dim {dim} ({shape[dim]}) not divisible by tp_size {tp_size}"
    return t[rank * per:(rank + 1) * per] if dim == 0 else t[:, rank * per:(rank + 1) * per]


def shard_for_rank(target_sd: dict, drafter_sd: dict | None, tp_size: int, rank: int) -> dict[str, torch.Tensor]:
    """Pre-shard whole checkpoints for one rank: keys ``target.<hf name>`` / ``drafter.<name>``.
    A tied lm_head is materialised from the embedding so each rank file stands alone."""
    out = {f"target.{k}": slice_for_rank(k, v, tp_size, rank).contiguous() for k, v in target_sd.items()}
    if "lm_head.weight" not in target_sd and "model.embed_tokens.weight" in target_sd:
        out["target.lm_head.weight"] = slice_for_rank(
            "lm_head.weight", target_sd["model.embed_tokens.weight"], tp_size, rank).contiguous()
    for k, v in (drafter_sd or {}).items():
        out[f"drafter.{k}"] = slice_for_rank(k, v, tp_size, rank).contiguous()
    return out
