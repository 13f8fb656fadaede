# SPDX-License-Identifier: Apache-2.0
"""Building blocks shared by the target families and the drafter: RMSNorm, the gated MLP, RoPE, masked attention."""
from __future__ import annotations

import math
from collections.abc import Iterable
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import DFlashError
from ..distributed import TPGroup
from ..kernels import GATED_GEMM_MAX_ROWS, GEMM_MAX_ROWS, MAX_QUERY_ROWS, TORCH, Kernels


class RMSNorm(nn.Module):
    # the rounding of norm(x) * weight: normalised and rounded to the model dtype, then times the weight (llama's);
    # gpt-oss's norm multiplies in float32 first (a fused TP all-reduce + add + norm must know which)
    weight_first = False

    def __init__(self, dim: int, eps: float, kernels: Kernels = TORCH):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.kernels = kernels   # batch-invariant Triton: the row-wise Triton norm

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x); with ``residual``, the fused add + norm (nano-vllm's form): returns (norm(x + residual),
        x + residual), one kernel on CUDA. Normalises in float32 like the references, returns the model dtype.
        In the batch-invariant mode on the Triton kernels, kernels/norm.py (one program per row, a launch fixed
        by the hidden size); the torch path's eager norm on the CPU is row-wise already."""
        if self.kernels.triton and self.kernels.batch_invariant:
            from ..kernels import norm
            if residual is None:
                return norm.rms_norm(x, self.weight, self.eps)
            total, normed = norm.rms_norm(residual, self.weight, self.eps, delta=x)
            return normed, total
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        total, normed = add_rms_norm(residual, x, self.weight, self.eps)
        return normed, total

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor | None = None):
        """(norm(residual + (x + bias)), residual + (x + bias)): a row-parallel projection's reduced output (its
        bias not yet added) into this residual add + norm, in this model's roundings."""
        return self(x if bias is None else x + bias, residual)


class MLP(nn.Module):
    """gate_up -> SiLU * up -> down of the Llama family and the drafter: column-parallel in, row-parallel out
    (one all-reduce)."""

    def __init__(self, hidden: int, inter: int, tp: TPGroup, kernels: Kernels = TORCH):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * (inter // tp.size), bias=False)
        self.down_proj = nn.Linear(inter // tp.size, hidden, bias=False)
        self.tp, self.kernels = tp, kernels   # Triton: the fused GEMMs where uses_gemm_kernel

    def fuses_residual(self, x: torch.Tensor) -> bool:
        """Whether forward(x, residual) adds the residual in down_proj's GEMM (Attention.fuses_residual's rule)."""
        return self.tp.size == 1 and uses_gemm_kernel(self.kernels, self.down_proj, x)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, reduce: bool = True) -> torch.Tensor:
        # x [n, T, hidden] -> [n, T, hidden] (+ residual [n, T, hidden] in the GEMM, only where fuses_residual;
        # reduce=False: this rank's partial sum, for TPGroup.all_reduce_add_norm)
        a = gate_up_silu(self.kernels, self.gate_up_proj, x)   # [n, T, inter / tp]
        if residual is not None:
            return gemm(a, self.down_proj.weight, None, residual, invariant=self.kernels.batch_invariant)
        out = project(self.kernels, self.down_proj, a)
        return self.tp.all_reduce(out) if reduce else out


class TargetHead(nn.Module):
    """What the engine needs from any target family besides forward(): token embedding, vocab-parallel
    logits and the KV-cache shape. Subclasses set embed_tokens, lm_head, layers (with .self_attn.kvh/.d)."""

    kernels: Kernels = TORCH   # set by the subclass's constructor: lm_head on the Triton GEMM where uses_gemm_kernel

    def kv_shape(self) -> tuple[int, int, int]:
        a = self.layers[0].self_attn
        return len(self.layers), a.kvh, a.d

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., vocab] in the model dtype, gathered over the vocab-parallel ranks
        (argmax needs no upcast; sampling upcasts to float32 itself)."""
        return self.tp.all_gather_last(project(self.kernels, self.lm_head, h))[..., : self.config.vocab_size]


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
        # positions [n, T] -> cos, sin [n, 1, T, head_dim]  (for x laid out [n, H, T, d])
        return self.cos[positions].to(dtype)[:, None], self.sin[positions].to(dtype)[:, None]

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [n, T] -> cos, sin [n, T, 1, head_dim]  (for x laid out [n, T, H, d], see norm_rope)
        return self.cos[positions].to(dtype)[:, :, None], self.sin[positions].to(dtype)[:, :, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [n, H, T, D] (rotate-half convention of HF Llama/Qwen)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def group_mask(visible: torch.Tensor, group: int) -> torch.Tensor:
    """[n, 1, T, S] -> [n, 1, group * T, S]: the mask of ``attend``'s grouped queries (build once per forward)."""
    n, _, T, S = visible.shape
    return visible if group == 1 else visible[:, :, None].expand(n, 1, group, T, S).reshape(n, 1, group * T, S)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float,
           invariant: bool = False) -> torch.Tensor:
    """q [n, Hq, T, D], k/v [n, Hkv, S, D], visible [n, 1, T, S] or group_mask(...) -> [n, T, Hq * D].

    Grouped-query attention runs as Hkv heads of (Hq / Hkv) * T queries each, so every K/V row is read
    once per KV head rather than once per query head (the GQA expansion would read the cache Hq/Hkv times).
    ``invariant`` (the batch-invariant mode on the CPU): the two matmuls and the masked softmax for every block
    size, never SDPA, whose flash kernel splits the queries and keys by the shapes it is given (a prompt prefilled
    alone and beside a longer one got different bits). The two matmuls run in float64 and round to q's dtype: the
    CPU's half-precision batched matmul picks its kernel by the number of matrices (on an AVX512-BF16 CPU a row's
    [2, 28] @ [28, 16] probabilities x values in a batch of 6 matrices got other bits than in a batch of 2), while
    in float64 the products of 16-bit values are exact and the sums' rounding error sits ~2^-45 of a bfloat16 step
    below it, so any kernel, batch or count of masked keys rounds a row to the same bits
    (tests/runtime/test_batch_invariance.py checks it).
    """
    n, H, T, D = q.shape
    G = H // k.shape[1]
    if G > 1:
        q = q.reshape(n, k.shape[1], G * T, D)  # query heads h = kv * G + g are adjacent
    if visible.shape[2] != G * T:
        visible = group_mask(visible, G)
    if invariant:
        scores = (q.double() @ k.double().transpose(-1, -2)).to(q.dtype)       # [n, Hkv, G * T, S]
        out = (masked_softmax(scores, visible, scale).double() @ v.double()).to(q.dtype)
    elif G * T <= _SMALL_QUERY:  # decode-sized: two batched matmuls beat a flash kernel's 64-row tiles
        probs = masked_softmax(q @ k.transpose(-1, -2), visible, scale)
        out = probs @ v
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)  # [n, Hkv, G * T, D]
    return out.view(n, -1, G, T, D).permute(0, 3, 1, 2, 4).reshape(n, T, H * D)


# ---- fused elementwise chains ------------------------------------------------------------------------
# At decode sizes a layer's norms, RoPE and gating are dozens of tiny kernels, each costing more in launch
# and latency than its bytes. On CUDA each chain below is compiled once (inductor, dynamic shapes) into one
# kernel; elsewhere it runs eagerly with identical math. TRTLLM_DFLASH_FUSE=0 turns compilation off.
_FUSE = os.environ.get("TRTLLM_DFLASH_FUSE", "1") != "0"


def _fused(fn):
    compiled = None

    def run(*args):
        nonlocal compiled
        if not (_FUSE and args[0].is_cuda):
            return fn(*args)
        if compiled is None:
            import torch._dynamo
            # Variants per dtype, eps and size-1 dims add up over several engines in one process; the
            # default limit (8) would stop compiling, and fullgraph turns that into an error, not eager.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
            torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4096)
            compiled = torch.compile(fn, dynamic=True, fullgraph=True)
        return compiled(*args)

    run.eager = fn
    return run


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@_fused
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return _rms(x, w, eps)


@_fused
def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float):
    """Residual add then RMSNorm: returns (x + delta, norm(x + delta))."""
    x = x + delta
    return x, _rms(x, w, eps)


@_fused
def norm_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, w: torch.Tensor | None, eps: float):
    """Optional per-head RMSNorm (Qwen3 q/k norm) then RoPE; x [n, T, H, d], cos/sin [n, T, 1, d]."""
    if w is not None:
        x = _rms(x, w, eps)
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


@_fused
def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 qw: torch.Tensor | None, kw: torch.Tensor | None, eps: float):
    """norm_rope on q and k in one kernel."""
    return norm_rope.eager(q, cos, sin, qw, eps), norm_rope.eager(k, cos, sin, kw, eps)


def rope_cache_write(q: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     q_w: torch.Tensor | None, k_w: torch.Tensor | None, eps: float, cache, layer: int, rows,
                     positions: torch.Tensor, kernels: Kernels = TORCH, want_k: bool = True):
    """Optional per-head q/k RMSNorm and RoPE, then k (roped) and v into cache rows ``rows`` at ``positions``.

    q [n, T, Hq, d] or None (the drafter's context rows have no queries), k/v [n, T, Hkv, d], cos/sin
    [n, T, 1, d] -> (q, k) roped, [n, T, H, d] (k None on the Triton kernels without ``want_k``: attention
    then reads k from the cache). Every attention of the Llama family and the drafter goes through here.
    ``kernels.triton``: one fused kernel (runtime/kernels/decode_attention.py) that writes the cache rows in
    place; else the compiled norm+RoPE chain and the cache's index_put (the reference, and CPU)."""
    if kernels.triton:
        from ..kernels import decode_attention
        return decode_attention.rope_cache_write(q, k, v, cos, sin, q_w, k_w, eps, cache.k[layer], cache.v[layer],
                                                 cache.row_ids(rows), positions, want_k)
    if q is None:
        k = norm_rope(k, cos, sin, k_w, eps)
    else:
        q, k = qk_norm_rope(q, k, cos, sin, q_w, k_w, eps)
    cache.write(layer, rows, positions, k, v)
    return q, k


@dataclass(frozen=True)
class KeyRange:
    """Which cache positions each query row sees: lo[i, t] <= position <= hi[i, t] (inclusive, [n, T]), and
    below the step's kv_len. The Triton attention's form of a mask (two integers per row instead of a
    [n, 1, T, S] boolean tensor); ``mask`` gives the boolean form, which tests compare with the torch masks."""
    lo: torch.Tensor
    hi: torch.Tensor

    @classmethod
    def causal(cls, positions: torch.Tensor, window: int | None = None) -> KeyRange:
        """Each row sees the keys up to its position (``positions`` [n, T]); with ``window``, only the last
        ``window`` of them: key p visible iff pos - window < p <= pos (transformers' sliding-window mask)."""
        lo = torch.zeros_like(positions) if window is None else (positions - window + 1).clamp(min=0)
        return cls(lo, positions)

    def mask(self, kv_len: int) -> torch.Tensor:
        p = torch.arange(kv_len, device=self.lo.device)[None, None, :]
        return ((p >= self.lo[:, :, None]) & (p <= self.hi[:, :, None]))[:, None]


def attend_cache(q: torch.Tensor, cache, layer: int, rows, kv_len: int, keys: KeyRange, scale: float,
                 sinks: torch.Tensor | None = None, span: int | None = None, invariant: bool = False) -> torch.Tensor:
    """The Triton attention of short query blocks: q [n, T, Hq, d] against cache[:kv_len] of ``rows``, keys
    visible per ``keys`` -> [n, T, Hq * d] (``attend``'s output layout). gpt-oss passes its ``sinks`` [Hq] and,
    on a sliding layer, ``span`` (the most keys a row sees), which sizes the kernel's split of the keys.
    ``invariant`` (the module's Kernels.batch_invariant): the batch-invariant launch (then any block size: prefill)."""
    from ..kernels import decode_attention
    return decode_attention.attend(q, cache.k[layer], cache.v[layer], cache.row_ids(rows), kv_len, keys.lo, keys.hi,
                                   scale, sinks=sinks, span=span, invariant=invariant)


def uses_attention_kernel(attn, T: int, kv_len: int | None) -> bool:
    """Whether a forward of T query rows per request runs attention in the Triton kernel: attention against the
    cache (kv_len set) of blocks up to MAX_QUERY_ROWS rows per KV head; prefill chunks keep SDPA, except in the
    batch-invariant mode, where every block runs the kernel (a prompt's cache must not depend on its chunking)."""
    return (attn.kernels.triton and kv_len is not None
            and (attn.kernels.batch_invariant or T * (attn.h // attn.kvh) <= MAX_QUERY_ROWS))


_GEMM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def uses_gemm_kernel(kernels: Kernels, lin: nn.Module, x: torch.Tensor, gated: bool = False) -> bool:
    """Whether projection ``lin`` of x [..., K] runs in the Triton GEMM (runtime/kernels/gemm.py): the
    module was built with the Triton kernels (kernels.triton, RuntimeConfig.kernels), ``lin`` is a plain nn.Linear
    (an Fp8Linear, which runtime/fp8.py swaps in, keeps its own FP8 GEMM) in a dtype tl.dot takes (bf16, fp16,
    fp32; float64 keeps cuBLAS) and x has at most GEMM_MAX_ROWS rows (GATED_GEMM_MAX_ROWS for the gate_up +
    SiLU kernel; kernels/__init__.py says where the two limits come from). Larger x stays on cuBLAS, except in the
    batch-invariant mode: there every x runs the Triton GEMM's tl.dot tiles (cuBLAS picks its tiles and split-K by
    M)."""
    rows = GATED_GEMM_MAX_ROWS if gated else GEMM_MAX_ROWS
    return (kernels.triton and type(lin) is nn.Linear and lin.weight.dtype in _GEMM_DTYPES
            and (kernels.batch_invariant or x.numel() <= rows * x.shape[-1]))


def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         residual: torch.Tensor | None = None, invariant: bool = False) -> torch.Tensor:
    """The Triton GEMM: x [..., K] @ weight [N, K]^T (+ bias) (+ residual [..., N]) -> [..., N]; the
    batch-invariant tile where ``invariant`` (the module's Kernels.batch_invariant) asks for it."""
    from ..kernels import gemm as kernels
    return kernels.linear(x, weight, bias, residual, invariant=invariant)


def project(kernels: Kernels, lin: nn.Module, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
    """lin(x): on the Triton GEMM where uses_gemm_kernel, else the module's own forward (which keeps an FP8
    module on its own GEMM). ``bias`` False leaves lin's bias out (a row-parallel projection adds it once, after
    the all-reduce); a biased module then runs F.linear on its weight."""
    if uses_gemm_kernel(kernels, lin, x):
        return gemm(x, lin.weight, lin.bias if bias else None, invariant=kernels.batch_invariant)
    return lin(x) if bias or lin.bias is None else F.linear(x, lin.weight)


def gate_up_silu(kernels: Kernels, lin: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of the fused gate_up projection ``lin`` (weight [2I, K]): x [..., K] -> [..., I]. One
    Triton kernel where uses_gemm_kernel, else the projection (cuBLAS or FP8) and the compiled silu_mul."""
    if uses_gemm_kernel(kernels, lin, x, gated=True):
        from ..kernels import gemm
        return gemm.gate_up_silu(x, lin.weight, invariant=kernels.batch_invariant)
    return silu_mul(lin(x))


_SMALL_QUERY = 16  # query rows per KV head up to which attention runs as plain matmuls (measured on H100)


@_fused
def masked_softmax(scores: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale * scores) over visible keys, in float32, returned in the scores' dtype."""
    s = (scores.float() * scale).masked_fill(~visible, float("-inf"))
    return s.softmax(-1).to(scores.dtype)


@_fused
def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def missing_tensors(names: Iterable[str], required: Iterable[str], where: str) -> None:
    """Raise naming the first required tensor absent from ``names``."""
    have = set(names)
    lost = [r for r in required if r not in have]
    if lost:
        raise DFlashError(f"{where}: tensor {lost[0]}", f"missing ({len(lost)} missing in all)",
                          "the checkpoint is incomplete or of another architecture; re-export it")


def assign_weights(module: nn.Module, sd: dict[str, torch.Tensor], where: str, device, dtype) -> None:
    """Replace the meta parameters by checkpoint tensors, checking names and shapes first."""
    expected = dict(module.named_parameters())
    missing_tensors(sd.keys(), list(expected), where)
    extra = sorted(set(sd) - set(expected))
    if extra:
        raise DFlashError(f"{where}: tensor {extra[0]}", f"is not part of this architecture ({len(extra)} unexpected)",
                          "normalise the checkpoint with dflash-build (it converts known drafter formats)")
    for name, p in expected.items():
        if name in sd and tuple(sd[name].shape) != tuple(p.shape):
            raise DFlashError(f"{where}: tensor {name}",
                              f"has shape {tuple(sd[name].shape)}, expected {tuple(p.shape)}",
                              "the checkpoint does not match its config.json (or the tp_size); re-export it")
    # FP8 weights and their float32 per-row scales (fp8_gemm), and packed MXFP4 experts (uint8) keep their
    # dtypes; everything else is cast.
    def cast(name: str, t: torch.Tensor) -> torch.Tensor:
        keep = t.dtype in (torch.float8_e4m3fn, torch.uint8) or name.endswith(".weight_scale")
        return t.to(device=device, dtype=None if keep else dtype)

    module.load_state_dict({k: cast(k, v) for k, v in sd.items()}, strict=False, assign=True)
