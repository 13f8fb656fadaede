# SPDX-License-Identifier: Apache-2.0
"""The DFlash drafter (z-lab checkpoint layout): Qwen3-style decoder layers whose attention sees the
target's fused features as extra K/V rows ("KV injection").

Per step: features of newly committed tokens -> ``fc`` -> ``hidden_norm`` -> k/v projections + k_norm +
RoPE at their absolute positions -> the draft KV cache (context rows only). The block
``[last committed token, mask x (B-1)]`` is embedded with the target's table and attends, without a
causal mask, to the cached context plus the whole block; the final ``norm`` and the target's ``lm_head``
turn positions 1..B-1 into the B-1 draft tokens.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...checkpoints.validate import check_tp
from ...model_config import DrafterConfig
from ..distributed import TPGroup
from ..kernels import TORCH, Kernels
from ..kv_cache import KVCache
from .layers import (KeyRange, RMSNorm, Rotary, gemm, group_mask, project, rope_cache_write, uses_attention_kernel,
                     uses_gemm_kernel)
from .llama import Attention, DecoderLayer

class DraftAttention(Attention):
    """The target's attention with Qwen3's q/k norm and o bias (gpt-oss drafters have one). forward() is the
    block's: qkv -> q/k norm + RoPE -> the block's K/V into the cache rows right after the context (so
    attention reads one tensor; append_context overwrites those rows after the verify) -> attend over
    cache[:kv_len] -> o_proj. context() writes K/V of target features, with no queries."""

    def __init__(self, c: DrafterConfig, tp: TPGroup, kernels: Kernels = TORCH):
        super().__init__(c, tp, qk_norm=True, o_bias=c.attention_bias, kernels=kernels)

    def context(self, x: torch.Tensor, cos, sin, cache: KVCache, layer: int, rows, positions) -> None:
        # x [n, T, hidden], cos/sin [n, T, 1, d], positions [n, T]: the k/v rows of qkv_proj (the same
        # weights serve context and block rows) -> k_norm + RoPE -> cache. On the Triton GEMM where the block's qkv
        # runs there: the rows appended per step vary (accepted tokens, stashed block-1 steps, prefill chunks)
        n, T, _ = x.shape
        q_rows = self.h * self.d
        bias = self.qkv_proj.bias[q_rows:] if self.qkv_proj.bias is not None else None
        w = self.qkv_proj.weight[q_rows:]
        if uses_gemm_kernel(self.kernels, self.qkv_proj, x):
            kv = gemm(x, w, bias, invariant=self.kernels.batch_invariant)
        else:
            kv = F.linear(x, w, bias)
        k, v = kv.view(n, T, 2 * self.kvh, self.d).chunk(2, dim=2)
        rope_cache_write(None, k, v, cos, sin, None, self.k_norm.weight, self.eps, cache, layer, rows, positions,
                         self.kernels, want_k=False)


class DFlashDrafter(nn.Module):
    def __init__(self, c: DrafterConfig, target_hidden_size: int, tp: TPGroup, max_positions: int,
                 kernels: Kernels = TORCH):
        super().__init__()
        check_tp((c.num_heads, c.num_kv_heads), tp.size, "drafter")
        self.config, self.kernels = c, kernels   # Triton: fc on the Triton GEMM where uses_gemm_kernel
        self.layers = nn.ModuleList(DecoderLayer(c, tp, DraftAttention(c, tp, kernels)) for _ in range(c.num_layers))
        self.fc = nn.Linear(len(c.target_layer_ids) * target_hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, kernels)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, kernels)
        self.rotary = Rotary(c.rope, c.head_dim, max_positions, c.max_position_embeddings)

    def kv_shape(self) -> tuple[int, int, int]:
        a = self.layers[0].self_attn
        return len(self.layers), a.kvh, a.d

    def append_context(self, feats: torch.Tensor, positions: torch.Tensor, cache: KVCache, rows) -> None:
        """Write context K/V for target features feats [n, T, n_feat * hidden] at positions [n, T]."""
        ctx = self.hidden_norm(project(self.kernels, self.fc, feats))
        cos, sin = self.rotary.tables(positions, ctx.dtype)
        for i, layer in enumerate(self.layers):
            layer.self_attn.context(ctx, cos, sin, cache, i, rows, positions)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx_len: torch.Tensor, cache: KVCache, rows,
                kv_len: int) -> torch.Tensor:
        """x [n, B, hidden] block embeddings at positions [n, B]; context rows < ctx_len [n] are valid.
        Returns the normed hidden states [n, B, hidden]."""
        B = x.shape[1]
        cos, sin = self.rotary.tables(positions, x.dtype)
        fused = uses_attention_kernel(self.layers[0].self_attn, B, kv_len)
        if not fused:
            key_pos = torch.arange(kv_len, device=x.device)                  # [S]
            rel = key_pos[None, None, :] - ctx_len[:, None, None]            # [n, 1, S]: key position - block start
        masks = {}  # layers with the same (causal, window) share one mask
        h = self.layers[0].input_layernorm(x)
        for i, layer in enumerate(self.layers):
            a, kind = layer.self_attn, (self.config.layer_causal[i], self.config.layer_window[i])
            if kind not in masks:
                masks[kind] = (self._keys(i, positions, ctx_len, B) if fused
                               else group_mask(self._mask(i, rel, B), a.h // a.kvh))
            nxt = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            h, x = layer(h, x, cos, sin, cache, i, rows, positions, masks[kind], kv_len, nxt)
        return h

    def _mask(self, layer: int, rel: torch.Tensor, B: int) -> torch.Tensor:
        """-> [n, 1, B, S]. Keys before the block are context (rel < 0); keys 0..B-1 are the block itself,
        seen in full (non-causal) unless the layer is causal; later cache rows are stale and hidden."""
        j = torch.arange(B, device=rel.device)[None, :, None]          # [1, B, 1] query offset in the block
        visible = (rel < 0) | ((rel < B) & ((rel <= j) if self.config.layer_causal[layer] else (rel >= 0)))
        window = self.config.layer_window[layer]
        if window is not None:  # by position distance, both ways (the reference's non-causal SWA rule)
            visible = visible & ((j - rel).abs() < window)
        return visible.expand(rel.shape[0], B, rel.shape[-1])[:, None]

    def _keys(self, layer: int, positions: torch.Tensor, ctx_len: torch.Tensor, B: int) -> KeyRange:
        """_mask's rule as a KeyRange (the Triton attention's form): the context and the whole block, i.e. keys
        up to ctx_len + B - 1, or up to the query's own position in a causal layer; a window keeps
        |query position - key position| < window."""
        hi = positions if self.config.layer_causal[layer] else (ctx_len[:, None] + (B - 1)).expand_as(positions)
        lo = torch.zeros_like(positions)
        window = self.config.layer_window[layer]
        if window is not None:
            lo = positions - (window - 1)
            hi = torch.minimum(hi, positions + (window - 1))
        return KeyRange(lo, hi)