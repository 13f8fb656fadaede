# SPDX-License-Identifier: Apache-2.0
"""Llama-family targets: Llama 2/3.x, SmolLM2, Mistral, Qwen2 (q/k/v bias) and Qwen3 (per-head q/k norm).

Weights keep Hugging Face names; q/k/v and gate/up are fused at load time (one GEMM each). Under
tensor parallelism each rank holds a slice of the heads and of the MLP (column-parallel in,
row-parallel out with one all-reduce each), the full embedding table, and a vocab slice of lm_head.
"""
from __future__ import annotations

import torch
from torch import nn

from ...checkpoints.validate import check_tp
from ...model_config import LlamaConfig
from .. import quant
from ..distributed import TPGroup
from ..kv_cache import KVCache
from ..shard import kv_heads_per_rank
from ..kernels import TORCH, Kernels
from .layers import (MLP, KeyRange, RMSNorm, Rotary, TargetHead, attend, attend_cache, gemm, group_mask,
                     missing_tensors, project, rope_cache_write, uses_attention_kernel, uses_gemm_kernel)

class Attention(nn.Module):
    """qkv -> (q/k norm) + RoPE -> cache write -> attend -> o_proj, for the targets and (as DraftAttention) the
    drafter. ``c`` is a LlamaConfig or DrafterConfig (model_config.ModelConfig's fields); ``kernels``: which
    kernels it runs (Kernels.choose), fixed for its life."""

    def __init__(self, c, tp: TPGroup, qk_norm: bool, o_bias: bool, kernels: Kernels = TORCH):
        super().__init__()
        self.h, self.kvh, self.d = c.num_heads // tp.size, kv_heads_per_rank(c.num_kv_heads, tp.size), c.head_dim
        self.qkv_proj = nn.Linear(c.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.h * self.d, c.hidden_size, bias=o_bias)
        self.q_norm = RMSNorm(self.d, c.rms_norm_eps, kernels) if qk_norm else None
        self.k_norm = RMSNorm(self.d, c.rms_norm_eps, kernels) if qk_norm else None
        self.eps, self.tp, self.kernels = c.rms_norm_eps, tp, kernels

    def forward(self, x, cos, sin, cache: KVCache, layer: int, rows, positions, visible, kv_len: int | None,
                residual: torch.Tensor | None = None, reduce: bool = True):
        """x [n, T, hidden]; cos/sin [n, T, 1, d]; positions [n, T]; visible [n, 1, T, S], built once per
        forward by the model (group_mask) and shared by its layers, or a KeyRange where the Triton attention
        runs (uses_attention_kernel) -> [n, T, hidden]; with ``residual`` [n, T, hidden] (only where
        fuses_residual(x)), residual + that, added in o_proj's epilogue; with ``reduce=False``, this rank's partial
        sum without o_proj's bias (the caller's TPGroup.all_reduce_add_norm reduces it).
        kv_len None = prefill (attend within this chunk); else over cache[:kv_len] incl. the rows written here."""
        n, T, _ = x.shape
        qkv = project(self.kernels, self.qkv_proj, x)   # [n, T, (h + 2 kvh) d]
        q, k, v = qkv.view(n, T, -1, self.d).split([self.h, self.kvh, self.kvh], dim=2)  # [n, T, H, d]
        fused_attention = isinstance(visible, KeyRange)
        q, k = rope_cache_write(q, k, v, cos, sin, _weight(self.q_norm), _weight(self.k_norm), self.eps,
                                cache, layer, rows, positions, self.kernels, want_k=kv_len is None)
        if fused_attention:
            return self.project_out(attend_cache(q, cache, layer, rows, kv_len, visible, self.d ** -0.5,
                                                 invariant=self.kernels.batch_invariant), residual, reduce)
        if kv_len is None:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        else:
            k, v = cache.read(layer, rows, kv_len)
        return self.project_out(attend(q.transpose(1, 2), k, v, visible, self.d ** -0.5,
                                       invariant=self.kernels.batch_invariant), residual, reduce)

    def fuses_residual(self, x: torch.Tensor) -> bool:
        """Whether forward(x, ..., residual) adds the residual in o_proj's GEMM: the Triton GEMM runs it
        (uses_gemm_kernel) and tp == 1 (row-parallel ranks hold partial sums, so at tp > 1 the residual joins
        after the all-reduce, in the caller's add + norm)."""
        return self.tp.size == 1 and uses_gemm_kernel(self.kernels, self.o_proj, x)

    def project_out(self, out: torch.Tensor, residual: torch.Tensor | None = None, reduce: bool = True) -> torch.Tensor:
        # row-parallel o_proj: a bias is added once, after the all-reduce (or in the epilogue at tp 1)
        b = self.o_proj.bias
        if residual is not None:   # tp 1, Triton GEMM (fuses_residual)
            return gemm(out, self.o_proj.weight, b, residual, invariant=self.kernels.batch_invariant)
        if not reduce:
            return project(self.kernels, self.o_proj, out, bias=False)
        out = self.tp.all_reduce(project(self.kernels, self.o_proj, out, bias=False))
        return out if b is None else out + b


def _weight(norm: RMSNorm | None) -> torch.Tensor | None:
    return None if norm is None else norm.weight


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer (Llama family and the DFlash drafter).

    forward(h, x, ..., next_norm) takes the residual stream x and h = this layer's input_layernorm(x), and
    returns (next_norm(y), y) for the layer's output y. The next layer's input norm (or the model's final
    norm) thus runs here, fused with the layer's last residual add, as in nano-vllm's
    ``RMSNorm(x, residual)`` chain: two add+norm kernels per layer; and y, the layer's output, exists as a
    tensor, so the target's feature taps cost nothing (in nano-vllm's order it only exists inside the next
    layer's norm, and a tap would add one add kernel).

    On the decode path with the Triton kernels at tp 1 (fuses_residual), o_proj and down_proj add the residual
    in their GEMM's epilogue and the norms after them are plain RMSNorms: norm, qkv, rope + cache write,
    attention (a split cache merged by its last split, no combine kernel), o_proj + residual, norm, gate_up +
    SiLU, down + residual = 8 kernels per layer. y is a new tensor either way (nothing is written in place), so the
    feature taps read the same values. At tp > 1 the projections hand their partial sums to
    TPGroup.all_reduce_add_norm: all-reduce, residual add and norm in one kernel where that pays (decode-sized
    rows beside the Triton kernels: the Lamport kernel, allreduce.LAMPORT_MAX_ROWS), else the all-reduce and then
    the add + norm."""

    def __init__(self, c, tp: TPGroup, attn: nn.Module):
        super().__init__()
        kernels = attn.kernels   # one choice per layer: the norms and MLP run what the attention was built with
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, kernels)
        self.self_attn = attn
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, kernels)
        self.mlp = MLP(c.hidden_size, c.intermediate_size, tp, kernels)
        self.tp = tp

    def forward(self, h, x, cos, sin, cache: KVCache, layer: int, rows, positions, visible, kv_len: int | None,
                next_norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        # h, x [n, T, hidden] -> next_norm(y), y [n, T, hidden]
        attn, norm, tp = self.self_attn, self.post_attention_layernorm, self.tp
        if attn.fuses_residual(h):
            x = attn(h, cos, sin, cache, layer, rows, positions, visible, kv_len, residual=x)
            h = norm(x)
        else:   # each projection's partial sums go into the all-reduce + add + norm (one kernel where it can)
            h, x = tp.all_reduce_add_norm(attn(h, cos, sin, cache, layer, rows, positions, visible, kv_len,
                                               reduce=False), x, norm, attn.o_proj.bias)
        if self.mlp.fuses_residual(h):
            x = self.mlp(h, residual=x)
            return next_norm(x), x
        return tp.all_reduce_add_norm(self.mlp(h, reduce=False), x, next_norm)


class LlamaTarget(TargetHead):
    """forward() returns final hidden states and the concatenated outputs of ``capture_layers``
    (z-lab convention: layer i output = HF ``hidden_states[i + 1]``)."""

    def __init__(self, c: LlamaConfig, tp: TPGroup, max_positions: int, capture_layers: tuple[int, ...] = (),
                 kernels: Kernels = TORCH):
        super().__init__()
        check_tp((c.num_heads, c.num_kv_heads), tp.size, "target")
        self.config, self.tp, self.capture_layers, self.kernels = c, tp, tuple(capture_layers), kernels
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, tp, Attention(c, tp, qk_norm=c.qk_norm, o_bias=False,
                                                                  kernels=kernels))
                                    for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, kernels)
        self.vocab_shard = -(-c.vocab_size // tp.size)  # lm_head rows per rank (last rank padded)
        self.lm_head = nn.Linear(c.hidden_size, self.vocab_shard, bias=False)
        self.rotary = Rotary(c.rope, c.head_dim, max_positions, c.max_position_embeddings)

    def forward(self, ids, positions, cache: KVCache, rows, kv_len: int | None):
        """ids, positions [n, T]; rows: cache rows (slice or index tensor).

        kv_len None = prefill (attend within this chunk, causal); else attend over cache[:kv_len].
        Returns h [n, T, hidden] (after the final norm) and features [n, T, len(capture) * hidden] or None.
        """
        x = self.embed(ids)
        cos, sin = self.rotary.tables(positions, x.dtype)
        a = self.layers[0].self_attn
        if uses_attention_kernel(a, ids.shape[1], kv_len):   # causal by absolute position, as the mask below
            visible = KeyRange.causal(positions)
        else:
            key_pos = positions if kv_len is None else torch.arange(kv_len, device=ids.device)[None]
            visible = (key_pos[:, None, :] <= positions[:, :, None])[:, None]  # causal by absolute position
            visible = group_mask(visible, a.h // a.kvh)  # built once, shared by every layer
        feats: dict[int, torch.Tensor] = {}
        h = self.layers[0].input_layernorm(x)
        for i, layer in enumerate(self.layers):
            nxt = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            h, x = layer(h, x, cos, sin, cache, i, rows, positions, visible, kv_len, nxt)  # x: layer i's output
            if i in self.capture_layers:
                feats[i] = x
        return h, torch.cat([feats[i] for i in self.capture_layers], -1) if feats else None


_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_to_module(raw: dict[str, torch.Tensor], model: LlamaTarget, device, dtype,
                         keep_fp8: bool = False) -> dict[str, torch.Tensor]:
    """A Llama target's HF tensors -> its module's (models.TargetFamily.to_module): ModelOpt FP8 / NVFP4 linears
    dequantised to ``dtype`` (quant.dequantize; FP8 ones kept, with their row scales, where ``keep_fp8``: the
    fp8_gemm linears), then fuse_checkpoint under ``model.``."""
    return fuse_checkpoint(quant.dequantize(raw, dtype, keep_fp8), "model.", model.config.num_layers)


def fuse_checkpoint(raw: dict[str, torch.Tensor], prefix: str, num_layers: int) -> dict[str, torch.Tensor]:
    """HF names of Llama-style layers (targets and the DFlash drafter) -> ours: q/k/v -> qkv_proj, gate/up ->
    gate_up_proj, ``prefix`` stripped.

    FP8 weights kept for fp8_gemm fuse the same way, their per-row ``weight_scale`` concatenated alongside."""
    out, used = {}, set()

    def take(name: str) -> torch.Tensor | None:
        used.add(name)
        return raw.get(name)

    for i in range(num_layers):
        src, dst = f"{prefix}layers.{i}.", f"layers.{i}."
        for kind in ("weight", "bias", "weight_scale"):
            qkv = [take(f"{src}self_attn.{p}_proj.{kind}") for p in "qkv"]
            if all(t is not None for t in qkv):
                out[f"{dst}self_attn.qkv_proj.{kind}"] = torch.cat(qkv)
            elif kind == "weight":
                missing = [f"{src}self_attn.{p}_proj.weight" for p, t in zip("qkv", qkv) if t is None]
                missing_tensors([], missing, "checkpoint")
        gate, up = take(f"{src}mlp.gate_proj.weight"), take(f"{src}mlp.up_proj.weight")
        if gate is None or up is None:
            missing = f"{src}mlp.gate_proj.weight" if gate is None else f"{src}mlp.up_proj.weight"
            missing_tensors([], [missing], "checkpoint")
        out[f"{dst}mlp.gate_up_proj.weight"] = torch.cat([gate, up])
        scales = [take(f"{src}mlp.{p}_proj.weight_scale") for p in ("gate", "up")]
        if all(t is not None for t in scales):
            out[f"{dst}mlp.gate_up_proj.weight_scale"] = torch.cat(scales)
    for name, t in raw.items():
        if name in used or name.endswith(_IGNORED_SUFFIXES):
            continue
        key = name[len(prefix):] if name.startswith(prefix) else name
        out[key] = t
    return out
