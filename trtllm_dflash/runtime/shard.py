# SPDX-License-Identifier: Apache-2.0
"""Tensor-parallel sharding rules, by Hugging Face tensor name (target and drafter alike).

column (dim 0): q/k/v and gate/up projections, split by heads / channels; where tp_size is a multiple of the KV
heads (more ranks than KV heads), k/v are replicated instead: each rank holds the one KV head its query heads use,
as TensorRT-LLM and vLLM do;
row (dim 1): o and down projections (their outputs are all-reduced);
vocab (dim 0, padded to equal shards): lm_head; everything else (norms, embeddings, ``fc``) replicated.
gpt-oss adds: attention ``sinks`` split with the q heads; MoE ``mlp.experts.*`` split two ways over the same
ranks, laid out like TensorRT-LLM's moe_tp x moe_ep grid (see ``expert_layout``): ep_size ranks split the
experts (dim 0), tp_size // ep_size ranks split each expert's intermediate dim; the router is replicated.
"""
from __future__ import annotations

import torch

from ..checkpoints import hf

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")
# gpt-oss experts, by tensor: the dim holding the intermediate channels (None: not split, added once).
# bf16 layout: gate_up_proj [E, H, 2I] (gate/up interleaved, so any even split keeps pairs), down_proj [E, I, H];
# MXFP4: *_blocks [E, rows, groups, 16] / *_scales [E, rows, groups], rows = outputs, groups of 32 inputs.
_EXPERT_INTERMEDIATE_DIM = {
    "gate_up_proj": 2, "gate_up_proj_bias": 1, "down_proj": 1, "down_proj_bias": None,
    "gate_up_proj_blocks": 1, "gate_up_proj_scales": 1, "down_proj_blocks": 2, "down_proj_scales": 2,
}


def shard_dim(name: str) -> int | str | None:
    """0 or 1 for a split dim, "vocab" for lm_head, None when replicated."""
    parts = name.split(".")
    if name == "lm_head.weight":
        return "vocab"
    if len(parts) >= 2 and parts[-2] == "experts" and parts[-1] in _EXPERT_INTERMEDIATE_DIM:
        return "experts"
    if parts[-1] == "sinks":
        return 0
    if len(parts) >= 2 and parts[-2] in _COLUMN:
        return 0
    # NVFP4 block scales [out, in / 16] split with their weight's inputs (FP8 scalars are replicated below).
    if len(parts) >= 2 and parts[-2] in _ROW and parts[-1] in ("weight", "weight_scale"):
        return 1
    return None


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads one rank holds: its share, or 1 (a replica) when there are more ranks than KV heads."""
    return max(1, num_kv_heads // tp_size)


def _kv_rows(t, shape: tuple[int, ...], tp_size: int, rank: int, num_kv_heads: int):
    """k/v projection rows of a rank when KV heads are replicated: the head of its query heads' group (rank r holds
    query heads [r h/tp, (r+1) h/tp), which all belong to group r // (tp / kv))."""
    per_head = shape[0] // num_kv_heads
    head = rank // (tp_size // num_kv_heads)
    return t[head * per_head:(head + 1) * per_head]


def expert_layout(tp_size: int, rank: int, ep_size: int) -> tuple[int, int, int]:
    """(ep_rank, moe_tp_size, moe_tp_rank) of a rank: TensorRT-LLM's ``Mapping`` order (ep rank varies fastest)."""
    assert tp_size % ep_size == 0, f"ep_size {ep_size} does not divide tp_size {tp_size}"
    return rank % ep_size, tp_size // ep_size, rank // ep_size


def _slice_experts(name: str, t, shape: tuple[int, ...], tp_size: int, rank: int, ep_size: int):
    ep_rank, moe_tp, moe_rank = expert_layout(tp_size, rank, ep_size)
    per_e = shape[0] // ep_size
    assert per_e * ep_size == shape[0], f"{name}: {shape[0]} experts not divisible by ep_size {ep_size}"
    index = [slice(ep_rank * per_e, (ep_rank + 1) * per_e)]
    dim = _EXPERT_INTERMEDIATE_DIM[name.rsplit(".", 1)[-1]]
    if dim is not None and moe_tp > 1:
        per = shape[dim] // moe_tp
        if per * moe_tp == shape[dim]:
            index += [slice(None)] * (dim - 1) + [slice(moe_rank * per, (moe_rank + 1) * per)]
        else:
            # Only MXFP4 down_proj groups can fail to split (2880 / 32 = 90 groups over 4 ranks): read them
            # whole; the model slices its channels after dequantising (gpt_oss.checkpoint_to_module).
            assert name.endswith(("down_proj_blocks", "down_proj_scales")), f"{name}: dim {dim} not divisible"
    return t[tuple(index)]


def slice_for_rank(name: str, t, tp_size: int, rank: int, shape: tuple[int, ...] | None = None,
                   ep_size: int = 1, num_kv_heads: int | None = None) -> torch.Tensor:
    """This rank's part of tensor ``t`` (a tensor or a safetensors lazy slice, which reads only that part).
    ``num_kv_heads``: the model's KV heads, needed where tp_size exceeds them (k/v are then replicated)."""
    if shape is None:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else tuple(t.get_shape())
    dim = shard_dim(name)
    parts = name.split(".")
    if (dim == 0 and num_kv_heads and tp_size > num_kv_heads and len(parts) >= 2 and parts[-2] in ("k_proj", "v_proj")
            and shape):
        return _kv_rows(t, shape, tp_size, rank, num_kv_heads)
    # 0-d tensors (per-tensor quantisation scales) and row-parallel scales per output channel ([out] or [out, 1])
    # are replicated; `[...]` also reads a 0-d safetensors slice, which `[:]` cannot.
    if tp_size == 1 or dim is None or not shape or (dim == 1 and (len(shape) == 1 or shape[1] == 1)):
        return t[...] if not isinstance(t, torch.Tensor) else t
    if dim == "experts":
        return _slice_experts(name, t, shape, tp_size, rank, ep_size)
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


def rank_tensors(path, tp_size: int, rank: int, *, presharded: dict | None = None, prefix: str = "",
                 allow_pickle: bool = False, ep_size: int = 1,
                 num_kv_heads: int | None = None) -> dict[str, torch.Tensor]:
    """This rank's tensors of a checkpoint folder, by HF name: safetensors are read as lazy slices (only this
    rank's part leaves the disk); pickle weights load whole, then are sliced. ``presharded``: the rank's tensors
    of both models as a build wrote them (shard_for_rank); those under ``prefix`` are taken instead of ``path``."""
    if presharded is not None:
        return {k[len(prefix):]: v for k, v in presharded.items() if k.startswith(prefix)}

    def this_rank(name: str, t) -> torch.Tensor:
        return slice_for_rank(name, t, tp_size, rank, ep_size=ep_size, num_kv_heads=num_kv_heads)

    return hf.load_state_dict(path, allow_pickle=allow_pickle, slicer=this_rank)


def tied_lm_head(sd: dict, tp_size: int, rank: int) -> dict[str, torch.Tensor]:
    """{"lm_head.weight": this rank's vocab rows of the (replicated) embedding} for a target whose checkpoint
    (HF names) has no lm_head.weight; {} when it has one, or has no embedding to tie to (assign_weights then names
    what is missing)."""
    if "lm_head.weight" in sd or "model.embed_tokens.weight" not in sd:
        return {}
    return {"lm_head.weight": slice_for_rank("lm_head.weight", sd["model.embed_tokens.weight"], tp_size, rank)}


def shard_for_rank(target_sd: dict, drafter_sd: dict | None, tp_size: int, rank: int,
                   ep_size: int = 1, kv_heads: tuple[int | None, int | None] = (None, None)) -> dict[str, torch.Tensor]:
    """Pre-shard whole checkpoints for one rank: keys ``target.<hf name>`` / ``drafter.<name>``.
    A tied lm_head is materialised from the embedding so each rank file stands alone. ``kv_heads``: the target's
    and the drafter's num_key_value_heads (for replication where tp_size exceeds them)."""
    out = {f"target.{k}": slice_for_rank(k, v, tp_size, rank, ep_size=ep_size, num_kv_heads=kv_heads[0]).contiguous()
           for k, v in target_sd.items()}
    out.update({f"target.{k}": v.contiguous() for k, v in tied_lm_head(target_sd, tp_size, rank).items()})
    for k, v in (drafter_sd or {}).items():
        out[f"drafter.{k}"] = slice_for_rank(k, v, tp_size, rank, num_kv_heads=kv_heads[1]).contiguous()
    return out
