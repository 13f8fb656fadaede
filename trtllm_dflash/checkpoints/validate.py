# SPDX-License-Identifier: Apache-2.0
"""Checks that a target and a DFlash drafter belong together, before any weight is read.

Each failed check raises DFlashError naming the field and the fix. ``check_pair`` returns the list of
checks that passed, which dflash-build records in the manifest.
"""
from __future__ import annotations

from ..errors import DFlashError
from ..model_config import DrafterConfig, check_heads


def _target_dims(t: dict) -> tuple[int, int, int, int]:
    heads = t["num_attention_heads"]
    return t["hidden_size"], t["vocab_size"], t["num_hidden_layers"], heads


def _head_counts(cfg: dict) -> tuple[int, int]:
    heads = cfg["num_attention_heads"]
    return heads, cfg.get("num_key_value_heads") or heads


def tp_sizes(*cfgs: dict) -> list[int]:
    """Every tp_size that the heads of all these models allow (model_config.check_heads' rule for each)."""
    top = min(heads for heads, _ in map(_head_counts, cfgs))
    return [k for k in range(1, top + 1) if all(check_heads(*_head_counts(c), k) is None for c in cfgs)]


def check_tp(cfg: dict, tp_size: int, who: str, *, together_with: tuple[dict, ...] = ()) -> None:
    """``together_with``: the other models the same ranks split, so the fix lists the sizes that suit them all
    at once (one error, not a second one for the drafter after the target's is fixed)."""
    problem = check_heads(*_head_counts(cfg), tp_size)
    if problem:
        raise DFlashError("tp_size", f"{problem} of the {who}", f"use one of {tp_sizes(cfg, *together_with)}")


def check_pair(target: dict, drafter: dict, *, tp_size: int = 1, block_size: int | None = None) -> list[str]:
    """Raise on the first incompatibility between target and drafter config.json dicts."""
    d = DrafterConfig.from_hf(drafter)
    hidden, vocab, layers, _ = _target_dims(target)
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
    check_tp(target, tp_size, "target", together_with=(drafter,))
    check_tp(drafter, tp_size, "drafter", together_with=(target,))
    passed.append("tp_divisibility")
    return passed
