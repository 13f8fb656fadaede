# SPDX-License-Identifier: Apache-2.0
"""Building blocks shared by the target families and the drafter: RMSNorm, RoPE, masked attention."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import DFlashError


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 like the reference implementations, then return to the model dtype.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_parameters(cfg: dict) -> dict:
    """One RoPE dict from either config style: transformers 5 ``rope_parameters`` or the older
    ``rope_theta`` + ``rope_scaling`` pair that hub configs still carry."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default")) or "default"
    return params


def rope_inv_freq(params: dict, head_dim: int, max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim // 2] (float64) and the attention scaling factor for cos/sin."""
    base = float(params["rope_theta"])
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    kind = params["rope_type"]
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(params["factor"]), 1.0
    if kind == "llama3":
        factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old = float(params["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        mid = (wavelen <= old / low) & (wavelen >= old / high)
        return torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled), 1.0
    if kind == "yarn":
        factor = float(params["factor"])
        old = float(params.get("original_max_position_embeddings") or max_position_embeddings)
        beta_fast, beta_slow = float(params.get("beta_fast") or 32), float(params.get("beta_slow") or 1)

        def correction_dim(rotations: float) -> float:
            return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if params.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        ramp = (torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)
        extrapolation = 1 - ramp.clamp(0, 1)
        inv = inv / factor * (1 - extrapolation) + inv * extrapolation
        mscale = params.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
        return inv, float(mscale)
    raise DFlashError("rope_type", f"{kind!r} is not supported", "use default, linear, llama3 or yarn")


class Rotary(nn.Module):
    """cos/sin tables for every position up to ``max_positions``, gathered per token."""

    def __init__(self, params: dict, head_dim: int, max_positions: int, max_position_embeddings: int):
        super().__init__()
        inv, scale = rope_inv_freq(params, head_dim, max_position_embeddings)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        # float32 tables like HF (which computes them in float32 then casts to the activation dtype).
        self.register_buffer("cos", (emb.cos() * scale).float(), persistent=False)
        self.register_buffer("sin", (emb.sin() * scale).float(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [n, T] -> cos, sin [n, 1, T, head_dim]
        return self.cos[positions].to(dtype)[:, None], self.sin[positions].to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [n, H, T, D] (rotate-half convention of HF Llama/Qwen)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, Hq, T, D], k/v [n, Hkv, S, D], visible [n, 1, T, S] bool -> [n, T, Hq * D]."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2).flatten(2)
