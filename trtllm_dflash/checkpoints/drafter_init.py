# SPDX-License-Identifier: Apache-2.0
"""An untrained DFlash drafter in the z-lab layout, shaped for a given target.

Its proposals are noise (acceptance ~ 1 token per step) but it exercises every code path, and greedy
output stays exactly the target's: the demo and the tests use it until a trained drafter is shipped.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..model_config import build_target_layer_ids
from . import hf


def drafter_config(target: dict, *, num_layers: int, block_size: int, target_layer_ids=None,
                   mask_token_id: int | None = None) -> dict:
    layers = target["num_hidden_layers"]
    ids = list(target_layer_ids) if target_layer_ids is not None else build_target_layer_ids(layers, num_layers)
    heads = target["num_attention_heads"]
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "rms_norm_eps", "vocab_size",
            "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters")
    cfg = {k: target[k] for k in keep if k in target}
    cfg.update(
        architectures=["DFlashDraftModel"], model_type="qwen3", num_hidden_layers=num_layers,
        num_key_value_heads=target.get("num_key_value_heads") or heads,
        head_dim=target.get("head_dim") or target["hidden_size"] // heads,
        attention_bias=False, tie_word_embeddings=False, block_size=block_size, num_target_layers=layers,
        layer_types=["full_attention"] * num_layers, torch_dtype=target.get("torch_dtype", "float32"),
        # The last id is a safe default mask row: an embedding that is never a real prompt token in practice.
        dflash_config={"mask_token_id": target["vocab_size"] - 1 if mask_token_id is None else mask_token_id,
                       "target_layer_ids": ids},
    )
    return cfg


def random_drafter_weights(cfg: dict, target_hidden: int, seed: int = 0, dtype=torch.float32,
                           device="cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator(device).manual_seed(seed)
    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d

    def w(*shape):
        return (torch.randn(*shape, generator=g, device=device) * 0.02).to(dtype)

    def ones(n):
        return torch.ones(n, dtype=dtype, device=device)

    sd = {"fc.weight": w(h, len(cfg["dflash_config"]["target_layer_ids"]) * target_hidden),
          "hidden_norm.weight": ones(h), "norm.weight": ones(h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        sd.update({
            p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
            p + "self_attn.q_norm.weight": ones(d), p + "self_attn.k_norm.weight": ones(d),
            p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
            p + "mlp.down_proj.weight": w(h, inter),
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
        })
    return sd


def write_random_drafter(target_dir: str | Path, out_dir: str | Path, *, num_layers: int = 1, block_size: int = 16,
                         target_layer_ids=None, mask_token_id: int | None = None, seed: int = 0,
                         dtype=torch.float32) -> Path:
    """Write config.json + model.safetensors of an untrained drafter for the target in ``target_dir``."""
    target = hf.read_config(target_dir)
    cfg = drafter_config(target, num_layers=num_layers, block_size=block_size,
                         target_layer_ids=target_layer_ids, mask_token_id=mask_token_id)
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    cfg["dflash_trained"] = False  # read by dflash-build / dflash-generate to say so plainly
    out = Path(out_dir)
    hf.save_state_dict(random_drafter_weights(cfg, target["hidden_size"], seed, dtype), out)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out
