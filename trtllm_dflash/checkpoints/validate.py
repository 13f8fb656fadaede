# SPDX-License-Identifier: Apache-2.0
"""Checks that a target and a DFlash drafter belong together, before any weight is read.

Each failed check raises DFlashError naming the field and the fix. ``check_pair`` returns the list of
checks that passed, which dflash-build records in the manifest.
"""
from __future__ import annotations

from ..errors import DFlashError
from ..model_config import DrafterConfig


def check_heads(num_heads: int, num_kv_heads: int, tp_size: int) -> str | None:
    """None when tp_size can split these attention heads, else what is wrong: the query heads must split evenly;
    the KV heads split evenly too, or are replicated when tp_size is a multiple of them."""
    if num_heads % tp_size:
        return f"{tp_size} does not divide num_attention_heads ({num_heads})"
    if num_kv_heads % tp_size and tp_size % num_kv_heads:
        return (f"{tp_size} neither divides num_key_value_heads ({num_kv_heads}) nor is a multiple of it (KV heads are "
                "split over the ranks, or replicated when there are more ranks than KV heads)")
    return None


def head_counts(cfg: dict) -> tuple[int, int]:
    """(num_attention_heads, num_key_value_heads) of a config.json dict, the form the tp checks take (a parsed
    model_config passes ``(c.num_heads, c.num_kv_heads)``)."""
    heads = cfg["num_attention_heads"]
    return heads, cfg.get("num_key_value_heads") or heads


def tp_sizes(*heads: tuple[int, int]) -> list[int]:
    """Every tp_size that all these (heads, kv_heads) pairs allow (check_heads' rule for each)."""
    top = min(h for h, _ in heads)
    return [k for k in range(1, top + 1) if all(check_heads(*h, k) is None for h in heads)]


def check_tp(heads: tuple[int, int], tp_size: int, who: str, *,
             together_with: tuple[tuple[int, int], ...] = ()) -> None:
    """``heads``: the model's (heads, kv_heads). ``together_with``: those of the other models the same ranks
    split, so the fix lists the sizes that suit them all at once (one error, not a second one for the drafter
    after the target's is fixed)."""
    problem = check_heads(*heads, tp_size)
    if problem:
        raise DFlashError("tp_size", f"{problem} of the {who}", f"use one of {tp_sizes(heads, *together_with)}")


def check_pair(target: dict, d: DrafterConfig, *, tp_size: int = 1, block_size: int | None = None) -> list[str]:
    """Raise on the first incompatibility between a target's config.json dict and the drafter's parsed config
    (parsed once, by whoever read it: the same object then builds the drafter). The target stays a dict: a
    TensorRT-LLM build checks targets the torch runtime has no model config for."""
    hidden, vocab, layers = target["hidden_size"], target["vocab_size"], target["num_hidden_layers"]
    passed = []
    if d.hidden_size != hidden:
        raise DFlashError("drafter hidden_size", f"{d.hidden_size} != target hidden_size {hidden}",
                          "use the drafter trained for this target")
    passed.append("hidden_size")
    if d.vocab_size is not None and d.vocab_size != vocab:
        raise DFlashError("drafter vocab_size", f"{d.vocab_size} != target vocab_size {vocab}",
                          "use the drafter trained for this target (it shares the target's embeddings and lm_head)")
    passed.append("vocab_size")
    if d.num_target_layers is not None and d.num_target_layers != layers:
        raise DFlashError("drafter num_target_layers", f"{d.num_target_layers} != target num_hidden_layers {layers}",
                          "use the drafter trained for this target")
    bad = [i for i in d.target_layer_ids if not 0 <= i < layers]
    if bad:
        raise DFlashError("drafter dflash_config.target_layer_ids", f"{bad} out of range for a {layers}-layer target",
                          "ids are 0-based layer outputs (z-lab convention); vLLM/speculators ids are +1: subtract 1")
    passed.append("target_layer_ids")
    if not 0 <= d.mask_token_id < vocab:
        raise DFlashError("drafter dflash_config.mask_token_id", f"{d.mask_token_id} is outside the vocabulary [0, {vocab})",
                          "set the mask id the drafter was trained with (must be a target token id)")
    passed.append("mask_token_id")
    if block_size is not None and not 1 <= block_size <= d.block_size:
        raise DFlashError("block_size", f"{block_size} exceeds the drafter's trained block_size {d.block_size}",
                          f"use max_draft_len <= {d.block_size - 1} (block_size = max_draft_len + 1)")
    passed.append("block_size")
    target_heads, drafter_heads = head_counts(target), (d.num_heads, d.num_kv_heads)
    check_tp(target_heads, tp_size, "target", together_with=(drafter_heads,))
    check_tp(drafter_heads, tp_size, "drafter", together_with=(target_heads,))
    passed.append("tp_divisibility")
    return passed
