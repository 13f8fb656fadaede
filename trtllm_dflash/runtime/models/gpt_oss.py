# SPDX-License-Identifier: Apache-2.0
"""gpt-oss targets (``GptOssForCausalLM``: openai/gpt-oss-20b and -120b).

Per layer, as in transformers' ``modeling_gpt_oss.py``: attention with q/k/v/o biases, YaRN RoPE and one
learned "sink" logit per head (an extra softmax column whose probability mass is dropped), on alternating
sliding-window (``sliding_window`` = 128) and full layers (``layer_types``); then a top-k MoE: a router
(linear + bias), softmax over the k chosen logits, and experts with biases and a clamped SwiGLU,
``(clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g)`` with ``g = min(gate, 7)``, gate/up interleaved in the
Hugging Face layout (gate = even columns).

Decode path (RuntimeConfig.kernels "triton": every module built with Kernels(triton=True)): the
layer runs as the Llama family's does: qkv and o_proj on the Triton GEMM at decode sizes (layers.uses_gemm_kernel),
RoPE + cache write in one Triton kernel and attention against the cache in the decode attention kernel
(runtime/kernels/decode_attention.py), here with the sinks and the sliding window (as KeyRange lo = pos - window
+ 1) inside it; each residual add (with o_proj's bias) + RMSNorm is one compiled kernel (at tp > 1 one kernel with
the all-reduce before it, the weight applied in float32 as here: TPGroup.all_reduce_add_norm); the router's top-k +
softmax one Triton kernel after its GEMM (runtime/kernels/router.py). The torch path below stays
the reference (eager, HF rounding) and runs where the switch says "torch" (CPU by default).

Weights keep Hugging Face names; q/k/v are fused into ``qkv_proj``. MXFP4 experts (``*_blocks`` +
``*_scales``, the published checkpoints) run one of three ways, chosen by ``moe_kernel`` (RuntimeConfig.mxfp4_moe):
  "triton":  kept MXFP4 on the GPU (4.25 bits per weight) and run by the fused routed-expert kernels of
             runtime/mxfp4_moe.py (Mxfp4Experts): gpt-oss-120b's weights are ~61 GiB, 20b's ~13 GiB;
  "triton_kernels": the same for one-token steps, and steps of 2+ tokens (DFlash verify, batched decode) on the
             triton_kernels library in its own layout (TritonKernelsExperts: twice the experts' memory);
  "dequant": dequantised on load to the model dtype (mxfp4.py; CPU, and the reference), which in bf16 costs
             memory (4.25 -> 16 bits per expert weight):
  gpt-oss-20b:  20.9 B params = 39.0 GiB (experts 35.6 GiB, 9.5 GiB as MXFP4; the checkpoint is 12.8 GiB);
  gpt-oss-120b: 116.8 B params = 217.6 GiB (experts 213.6 GiB, 56.7 GiB as MXFP4; checkpoint 60.8 GiB).
20b fits one 80 GB GPU; 120b needs TP 4 (~55 GiB per rank) or TP 8 (~28 GiB per rank; the 1.1 GiB
embedding is replicated), before KV cache.

Tensor/expert parallelism over the same ranks: attention heads split as in llama.py (q heads, KV heads and
the sinks with their q heads; the o bias is added once, after the all-reduce). Experts follow TensorRT-LLM's
moe_tp x moe_ep layout (shard.py ``expert_layout``): ep_size ranks split the experts, tp_size // ep_size
ranks split each expert's intermediate dim; the router is replicated, every rank computes its own experts
(or channel slices) for all tokens, and one all-reduce sums the partial outputs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...checkpoints.validate import check_heads
from ...errors import DFlashError
from ...model_config import GptOssConfig
from .. import quant
from ..distributed import TPGroup
from ..kernels import TORCH, Kernels
from ..kv_cache import KVCache
from ..shard import expert_layout, kv_heads_per_rank
from . import mxfp4
from .layers import (KeyRange, RMSNorm, Rotary, TargetHead, _fused, apply_rope, attend_cache, project, rope_cache_write,
                     missing_tensors, uses_attention_kernel)

SWIGLU_ALPHA = 1.702  # fixed in the reference (not a config field)
_ATTN_CHUNK = 1 << 28  # float32 score elements per attention chunk (1 GiB), bounds long-prefill memory


def check_parallel(c: GptOssConfig, tp_size: int, ep_size: int) -> None:
    problem = check_heads(c.num_heads, c.num_kv_heads, tp_size)
    if problem:
        raise DFlashError("tp_size", f"{problem} of the target", "pick a tp_size that divides the attention heads "
                          "and divides or is a multiple of the KV heads")
    checks = [("num_local_experts", c.num_experts, ep_size, "ep_size")]
    if tp_size % ep_size:
        raise DFlashError("ep_size", f"{ep_size} does not divide tp_size {tp_size} (experts are split over the tp "
                          "ranks as moe_tp x ep)", "use an ep_size that divides tp_size")
    checks.append(("intermediate_size", c.intermediate_size, tp_size // ep_size, "tp_size / ep_size"))
    for field, n, size, what in checks:
        if n % size:
            raise DFlashError(what.split(" ")[0], f"{what} = {size} does not divide the target's {field} ({n})",
                              f"pick sizes that divide {n}")


@_fused
def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in the reference's rounding: it scales by the weight in float32 before casting back (llama's
    norm casts first)."""
    x32 = x.float()
    return (w.float() * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


@_fused
def _add_norm(residual: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float, bias: torch.Tensor | None):
    """(residual + x, its norm), o_proj's ``bias`` added to x first when given. Eager (``.eager``): the reference's
    roundings (x + bias rounded to the model dtype, then the sum). Compiled (CUDA): one kernel, eager's math, but
    inductor keeps intermediates in float32 (it adds all three and the norm reads the sum before their bf16
    rounding), so a bf16 result can differ from eager's by a rounding here and there."""
    total = residual + (x if bias is None else x + bias)
    return total, _norm.eager(total, w, eps)


class GptOssRMSNorm(RMSNorm):
    weight_first = True   # _norm's rounding

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor | None = None):
        """RMSNorm.add_norm on the decode kernels' path (one compiled kernel, the bias inside it)."""
        return self(x, residual, bias=bias, fused=self.kernels.triton)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                fused: bool = False):
        """As RMSNorm.forward (with ``residual``: (norm(x + residual), x + residual); ``bias``, added to x
        first, only with a residual), in the reference's rounding (_norm). ``fused`` (the decode kernels' switch):
        one compiled kernel on CUDA (_fused); else eager ops, the reference: a compiled kernel changes bf16
        results on CUDA by a rounding here and there."""
        if residual is None:
            return (_norm if fused else _norm.eager)(x, self.weight, self.eps)
        total, normed = (_add_norm if fused else _add_norm.eager)(residual, x, self.weight, self.eps, bias)
        return normed, total


def attend_with_sinks(q, k, v, visible, sinks, scale: float) -> torch.Tensor:
    """q [n, Hq, T, D], k/v [n, Hkv, S, D], visible [n, 1, T, S] bool, sinks [Hq] -> [n, T, Hq * D].

    softmax([q.k * scale, sink]) per head with the sink column dropped, computed exactly (SDPA has no sink
    term), in float32; the q heads of one KV group share its k/v without copying them."""
    n, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    g = Hq // Hkv
    sink = sinks.float().view(1, Hq, 1, 1)
    out = q.new_empty(n, T, Hq, D)
    step = max(1, _ATTN_CHUNK // max(1, n * Hq * S))
    for t0 in range(0, T, step):  # query chunks: prefill of long prompts stays within _ATTN_CHUNK
        qc = q[:, :, t0:t0 + step]
        tc = qc.shape[2]
        scores = torch.matmul(qc.reshape(n, Hkv, g * tc, D), k.transpose(-1, -2)).view(n, Hq, tc, S).float() * scale
        scores = scores.masked_fill(~visible[:, :, t0:t0 + step], float("-inf"))
        logits = torch.cat([scores, sink.expand(n, Hq, tc, 1)], dim=-1)
        probs = torch.softmax(logits, dim=-1)[..., :S].to(v.dtype)                    # [n, Hq, tc, S]
        o = torch.matmul(probs.view(n, Hkv, g * tc, S), v).view(n, Hq, tc, D)
        out[:, t0:t0 + step] = o.transpose(1, 2)
    return out.flatten(2)


class Attention(nn.Module):
    def __init__(self, c: GptOssConfig, tp: TPGroup, sliding: bool, kernels: Kernels = TORCH):
        super().__init__()
        self.h, self.kvh, self.d = c.num_heads // tp.size, kv_heads_per_rank(c.num_kv_heads, tp.size), c.head_dim
        self.qkv_proj = nn.Linear(c.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.h * self.d, c.hidden_size, bias=c.attention_bias)
        self.sinks = nn.Parameter(torch.empty(self.h))  # this rank's q heads' sink logits
        self.sliding, self.tp, self.window = sliding, tp, c.sliding_window
        self.kernels = kernels   # Triton: the decode kernels

    def forward(self, x, cos, sin, cache: KVCache, layer: int, rows, positions, visible, kv_len: int | None,
                add_bias: bool = True, reduce: bool = True):
        """x [n, T, hidden]; positions [n, T]; visible [n, 1, T, S] (window already applied on sliding layers),
        or a KeyRange where the Triton attention runs (uses_attention_kernel); cos/sin [n, T, 1, d]
        (Rotary.tables) -> [n, T, hidden], o_proj's bias added iff ``add_bias``
        (the fused path adds it in the following add + norm)."""
        n, T, _ = x.shape
        qkv = project(self.kernels, self.qkv_proj, x)   # [n, T, (h + 2 kvh) d]; the Triton GEMM where uses_gemm_kernel
        q, k, v = qkv.view(n, T, -1, self.d).split([self.h, self.kvh, self.kvh], dim=2)  # [n, T, H, d]
        if self.kernels.triton:
            # no q/k norm (weights None); k for the prefill's attention only
            q, k = rope_cache_write(q, k, v, cos, sin, None, None, 0.0, cache, layer, rows, positions, self.kernels,
                                    want_k=kv_len is None)
            if isinstance(visible, KeyRange):   # on a sliding layer the keys carry the window: span = its reach
                span = self.window + T - 1 if self.sliding else None
                return self._out(attend_cache(q, cache, layer, rows, kv_len, visible, self.d ** -0.5, self.sinks, span,
                                              invariant=self.kernels.batch_invariant),
                                 add_bias, reduce)
        else:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)   # elementwise: the [n, T, H, d] layout is fine
            cache.write(layer, rows, positions, k, v)
        if kv_len is not None:  # decode/verify: attend over the cached prefix (incl. the rows just written)
            k, v = cache.read(layer, rows, kv_len)
        else:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        return self._out(attend_with_sinks(q.transpose(1, 2), k, v, visible, self.sinks, self.d ** -0.5), add_bias,
                         reduce)

    def _out(self, out: torch.Tensor, add_bias: bool, reduce: bool = True) -> torch.Tensor:
        # row-parallel: the bias once, after the all-reduce (here or in the next add + norm); reduce=False: this
        # rank's partial sum, for TPGroup.all_reduce_add_norm
        out = project(self.kernels, self.o_proj, out, bias=False)
        if not reduce:
            return out
        out = self.tp.all_reduce(out)
        return out if self.o_proj.bias is None or not add_bias else out + self.o_proj.bias


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows of a [N, K] in expert-sorted groups (ends ``offs`` [E]) times b [E, K, M] -> [N, M]; rows past
    offs[-1] are undefined. grouped_mm where it runs (CPU f32/bf16/f16, CUDA bf16), else one GEMM per expert."""
    if a.dtype in ((torch.bfloat16,) if a.is_cuda else (torch.float32, torch.bfloat16, torch.float16)):
        return F.grouped_mm(a, b, offs=offs)
    out, lo = a.new_zeros(a.shape[0], b.shape[-1]), 0
    for e, hi in enumerate(offs.tolist()):
        out[lo:hi] = a[lo:hi] @ b[e]
        lo = hi
    return out


class Experts(nn.Module):
    """This rank's experts ([first, first + num_local)) and intermediate channels, in the HF layout. Torch
    matmuls: batch-invariant where the torch path is (half precision on the CPU), not on CUDA, whatever
    ``invariant`` says (taken for the same interface as Mxfp4Experts)."""

    def __init__(self, c: GptOssConfig, tp: TPGroup, ep_size: int, invariant: bool = False):
        super().__init__()
        ep_rank, moe_tp, moe_rank = expert_layout(tp.size, tp.rank, ep_size)
        self.num_local, self.limit = c.num_experts // ep_size, c.swiglu_limit
        self.first = ep_rank * self.num_local
        self.inter, self.moe_rank = c.intermediate_size // moe_tp, moe_rank
        E, H, I = self.num_local, c.hidden_size, self.inter
        self.gate_up_proj = nn.Parameter(torch.empty(E, H, 2 * I))   # columns: gate0, up0, gate1, up1, ...
        self.gate_up_proj_bias = nn.Parameter(torch.empty(E, 2 * I))
        self.down_proj = nn.Parameter(torch.empty(E, I, H))
        self.down_proj_bias = nn.Parameter(torch.empty(E, H))       # full on every rank, added by moe rank 0

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, H]; experts, weights [N, k] (global ids, routing weights) -> this rank's partial sum [N, H].

        Sort-based grouped GEMMs with no host sync (CUDA-graph safe): the N * k (token, expert) slots are
        sorted by local expert; slots of other ranks' experts sort last, past offs[-1], and contribute 0."""
        N, k = experts.shape
        local = (experts - self.first).flatten()                                        # [N * k]
        local = torch.where((local >= 0) & (local < self.num_local), local, self.num_local)
        order = torch.argsort(local, stable=True)
        e_sorted = local[order]                                                         # [N * k]
        offs = torch.searchsorted(e_sorted, torch.arange(1, self.num_local + 1, device=x.device)).to(torch.int32)
        mine, e_idx = e_sorted < self.num_local, e_sorted.clamp(max=self.num_local - 1)
        gate_up = _grouped_mm(x[order // k], self.gate_up_proj, offs) + self.gate_up_proj_bias[e_idx]
        gate = gate_up[:, 0::2].clamp(max=self.limit)
        up = gate_up[:, 1::2].clamp(min=-self.limit, max=self.limit)
        y = _grouped_mm((up + 1) * gate * torch.sigmoid(gate * SWIGLU_ALPHA), self.down_proj, offs)
        if self.moe_rank == 0:
            y = y + self.down_proj_bias[e_idx]
        y = torch.where(mine[:, None], y * weights.flatten()[order, None].to(y.dtype), 0)
        # Back to (token, k) order and sum over k: deterministic (no atomics), unlike index_add on CUDA.
        return torch.empty_like(y).index_copy_(0, order, y).view(N, k, -1).sum(1)


class Mxfp4Experts(nn.Module):
    """This rank's experts kept in the published MXFP4 layout (blocks [E, rows, K / 32, 16] uint8 + scales
    [E, rows, K / 32] E8M0, rows = outputs; gate_up rows interleaved gate0, up0, ...) and run by the fused
    Triton kernels of runtime/mxfp4_moe.py (CUDA only). Same interface and result as Experts (bf16 rounding)."""

    def __init__(self, c: GptOssConfig, tp: TPGroup, ep_size: int, invariant: bool = False):
        super().__init__()
        self._layout = (c, tp, ep_size)
        self.invariant = invariant   # Kernels.batch_invariant: mxfp4_moe.invariant_tiles at every token count
        ep_rank, moe_tp, moe_rank = expert_layout(tp.size, tp.rank, ep_size)
        self.num_local, self.limit, self.num_experts = c.num_experts // ep_size, c.swiglu_limit, c.num_experts
        self.first = ep_rank * self.num_local
        self.inter, self.moe_rank = c.intermediate_size // moe_tp, moe_rank
        E, H, I = self.num_local, c.hidden_size, self.inter
        if H % mxfp4.GROUP or I % mxfp4.GROUP:
            raise DFlashError("mxfp4_moe", f"'triton' needs whole MXFP4 groups of {mxfp4.GROUP} per rank; hidden {H} "
                              f"and this rank's intermediate {I} (tp_size / ep_size = {moe_tp}) are not",
                              "use an ep_size that keeps whole groups per rank, or mxfp4_moe='dequant'")

        def packed(*shape):  # integer tensors: never trained, never cast by the loader
            return nn.Parameter(torch.empty(*shape, dtype=torch.uint8), requires_grad=False)

        self.gate_up_proj_blocks = packed(E, 2 * I, H // mxfp4.GROUP, mxfp4.GROUP // 2)
        self.gate_up_proj_scales = packed(E, 2 * I, H // mxfp4.GROUP)
        self.gate_up_proj_bias = nn.Parameter(torch.empty(E, 2 * I))
        self.down_proj_blocks = packed(E, H, I // mxfp4.GROUP, mxfp4.GROUP // 2)
        self.down_proj_scales = packed(E, H, I // mxfp4.GROUP)
        self.down_proj_bias = nn.Parameter(torch.empty(E, H))       # full on every rank, added by moe rank 0

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, H]; experts, weights [N, k] (global ids, routing weights) -> this rank's partial sum [N, H]."""
        from .. import mxfp4_moe  # Triton: imported only where this kernel was chosen
        return mxfp4_moe.fused_experts(
            x, experts, weights, self.gate_up_proj_blocks, self.gate_up_proj_scales, self.gate_up_proj_bias,
            self.down_proj_blocks, self.down_proj_scales, self.down_proj_bias if self.moe_rank == 0 else None,
            first=self.first, num_experts=self.num_experts, limit=self.limit, alpha=SWIGLU_ALPHA,
            invariant=self.invariant)

    def dequantized(self, dtype: torch.dtype) -> Experts:
        """The same experts as an Experts module in ``dtype`` on the same device: the reference path."""
        with torch.device("meta"):
            ref = Experts(*self._layout)
        dq = {"gate_up_proj": mxfp4.dequantize(self.gate_up_proj_blocks, self.gate_up_proj_scales, dtype),
              "down_proj": mxfp4.dequantize(self.down_proj_blocks, self.down_proj_scales, dtype),
              "gate_up_proj_bias": self.gate_up_proj_bias.detach().to(dtype),
              "down_proj_bias": self.down_proj_bias.detach().to(dtype)}
        ref.load_state_dict(dq, assign=True)
        return ref.requires_grad_(False)


class TritonKernelsExperts(Mxfp4Experts):
    """Mxfp4Experts whose steps of LIBRARY_MIN_TOKENS tokens or more run on triton_kernels' matmul_ogs (runtime/
    triton_kernels_moe.py: the Triton MoE kernels vLLM runs gpt-oss on, in their Hopper layouts), and whose
    one-token steps (batch-1 AR) stay on our gemv kernels, which are faster there. Measured on one gpt-oss-120b
    MoE layer on an H200 (benchmarks/results/mxfp4_decode_h200/triton_kernels/): 1 token ours 0.049 ms vs 0.074;
    a block of 10 0.333 vs 0.244 (uniform routing), 0.327 vs 0.150 (skewed); 4 sequences x 10 tokens 1.51 vs 0.53.
    The price is memory: the library holds its own re-laid-out copy of the experts (``prepare``), so the experts
    take twice their MXFP4 bytes (120b: 2 x 57 GiB on one GPU; split by tp_size like the rest)."""

    LIBRARY_MIN_TOKENS = 2

    def __init__(self, c: GptOssConfig, tp: TPGroup, ep_size: int, invariant: bool = False):
        if invariant:
            raise DFlashError("mxfp4_moe", "'triton_kernels' picks its tiles by the token count, so its results are "
                              "not batch invariant", "use mxfp4_moe='triton' with batch_invariant")
        super().__init__(c, tp, ep_size, invariant)
        self.library = None

    def prepare(self) -> None:
        """Build the library's copy from the weights now in the parameters: after loading, before any step (never
        inside a CUDA graph capture, which would record the copy instead of making it)."""
        from .. import triton_kernels_moe  # imported only where this kernel was chosen
        self.library = None                # the old copy's memory is free before the new one is made
        self.library = triton_kernels_moe.MatmulOgsExperts(self)

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < self.LIBRARY_MIN_TOKENS:
            return super().forward(x, experts, weights)
        if self.library is None:
            raise DFlashError("mxfp4_moe", "'triton_kernels' experts ran before their library copy was made",
                              "call gpt_oss.after_load(model) once the weights are in place")
        return self.library(x, experts, weights)


MOE_KERNELS = {"dequant": Experts, "triton": Mxfp4Experts, "triton_kernels": TritonKernelsExperts}


def after_load(model: nn.Module) -> None:
    """What the experts need once their weights are in place: the library copy of TritonKernelsExperts."""
    for m in model.modules():
        if isinstance(m, TritonKernelsExperts):
            m.prepare()


class MoE(nn.Module):
    def __init__(self, c: GptOssConfig, tp: TPGroup, ep_size: int, moe_kernel: str = "dequant",
                 kernels: Kernels = TORCH):
        super().__init__()
        self.router = nn.Linear(c.hidden_size, c.num_experts, bias=True)  # replicated
        self.experts = MOE_KERNELS[moe_kernel](c, tp, ep_size, invariant=kernels.batch_invariant)
        self.top_k, self.tp, self.kernels = c.experts_per_token, tp, kernels

    def forward(self, x: torch.Tensor, fused: bool = False, reduce: bool = True) -> torch.Tensor:
        """x [..., hidden] -> [..., hidden]. ``fused``: the router's top-k + softmax in one Triton kernel after its
        GEMM (kernels/router.py): the same ids and weights up to the weights' last rounding. reduce=False: this
        rank's partial sum, for TPGroup.all_reduce_add_norm."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])                                          # [N, hidden]
        # In the batch-invariant mode the router's GEMM is the Triton GEMM's fixed tile too: cuBLAS picks its
        # tiles by the row count, and a last-bit change of a logit can swap a near-tie expert.
        logits = project(self.kernels, self.router, x) if self.kernels.batch_invariant else self.router(x)
        if fused:
            from ..kernels import router
            top_ids, weights = router.topk_softmax(logits, self.top_k)       # [N, k] int64, [N, k]
        else:
            top_logits, top_ids = logits.topk(self.top_k, dim=-1)            # [N, k]
            weights = torch.softmax(top_logits, dim=-1)                      # softmax over the k chosen only
        out = self.experts(x, top_ids, weights)
        return (self.tp.all_reduce(out) if reduce else out).view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, c: GptOssConfig, tp: TPGroup, ep_size: int, sliding: bool, moe_kernel: str,
                 kernels: Kernels = TORCH):
        super().__init__()
        self.input_layernorm = GptOssRMSNorm(c.hidden_size, c.rms_norm_eps, kernels)
        self.self_attn = Attention(c, tp, sliding, kernels)
        self.post_attention_layernorm = GptOssRMSNorm(c.hidden_size, c.rms_norm_eps, kernels)
        self.mlp = MoE(c, tp, ep_size, moe_kernel, kernels)

    def forward(self, h, x, cos, sin, cache: KVCache, layer: int, rows, positions, visible, kv_len: int | None,
                next_norm: GptOssRMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """h = input_layernorm(x), x [n, T, hidden] -> (next_norm(y), y) for the layer's output y (the same
        contract as llama.DecoderLayer: the next layer's input norm runs here, after the last residual add).
        With the decode kernels (self_attn.kernels.triton) o_proj's bias joins the first add + norm, the router's
        top-k runs fused, and each projection's partial sums go into TPGroup.all_reduce_add_norm (at tp > 1 the
        all-reduce, residual add and norm in one kernel where it can; else the all-reduce, then the add + norm)."""
        attn, norm, tp = self.self_attn, self.post_attention_layernorm, self.self_attn.tp
        if not attn.kernels.triton:   # the reference's ops, one at a time
            h, x = norm(attn(h, cos, sin, cache, layer, rows, positions, visible, kv_len), x)
            return next_norm(self.mlp(h), x)
        a = attn(h, cos, sin, cache, layer, rows, positions, visible, kv_len, add_bias=False, reduce=False)
        h, x = tp.all_reduce_add_norm(a, x, norm, attn.o_proj.bias)
        return tp.all_reduce_add_norm(self.mlp(h, fused=True, reduce=False), x, next_norm)


class GptOssTarget(TargetHead):
    """Same interface as llama.LlamaTarget: forward() returns the final hidden states and the concatenated
    outputs of ``capture_layers`` (z-lab convention: layer i output = HF ``hidden_states[i + 1]``)."""

    def __init__(self, c: GptOssConfig, tp: TPGroup, max_positions: int, capture_layers: tuple[int, ...] = (),
                 ep_size: int = 1, moe_kernel: str = "dequant", kernels: Kernels = TORCH):
        super().__init__()
        check_parallel(c, tp.size, ep_size)
        if moe_kernel not in MOE_KERNELS:
            raise DFlashError("mxfp4_moe", f"unknown experts kernel {moe_kernel!r}",
                              f"use one of {', '.join(MOE_KERNELS)}")
        self.config, self.tp, self.ep_size, self.capture_layers = c, tp, ep_size, tuple(capture_layers)
        self.moe_kernel, self.kernels = moe_kernel, kernels
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, tp, ep_size, t == "sliding_attention", moe_kernel, kernels)
                                    for t in c.layer_types)
        self.norm = GptOssRMSNorm(c.hidden_size, c.rms_norm_eps, kernels)
        self.vocab_shard = -(-c.vocab_size // tp.size)  # lm_head rows per rank (last rank padded)
        self.lm_head = nn.Linear(c.hidden_size, self.vocab_shard, bias=False)
        self.rotary = Rotary(c.rope, c.head_dim, max_positions, c.max_position_embeddings)

    def forward(self, ids, positions, cache: KVCache, rows, kv_len: int | None):
        """ids, positions [n, T]; rows: cache rows (slice or index tensor).

        kv_len None = prefill (attend within this chunk, causal); else attend over cache[:kv_len]. Masks
        go by absolute position, so stale cache rows past a request's length are never seen.
        Returns h [n, T, hidden] (after the final norm) and features [n, T, len(capture) * hidden] or None.
        """
        x = self.embed(ids)
        a = self.layers[0].self_attn
        fused = a.kernels.triton
        cos, sin = self.rotary.tables(positions, x.dtype)                    # [n, T, 1, d]
        if uses_attention_kernel(a, ids.shape[1], kv_len):
            full, window = KeyRange.causal(positions), KeyRange.causal(positions, self.config.sliding_window)
        else:
            key_pos = positions if kv_len is None else torch.arange(kv_len, device=ids.device)[None]
            behind = positions[:, :, None] - key_pos[:, None, :]             # [n, T, S] query pos - key pos
            full = (behind >= 0)[:, None]                                    # causal
            window = (full & (behind < self.config.sliding_window)[:, None])  # ... and the last `window` tokens
        feats: dict[int, torch.Tensor] = {}
        h = self.layers[0].input_layernorm(x, fused=fused)
        for i, layer in enumerate(self.layers):
            visible = window if layer.self_attn.sliding else full
            nxt = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            h, x = layer(h, x, cos, sin, cache, i, rows, positions, visible, kv_len, nxt)  # x: layer i's output
            if i in self.capture_layers:
                feats[i] = x
        return h, torch.cat([feats[i] for i in self.capture_layers], -1) if feats else None


def checkpoint_to_module(raw: dict[str, torch.Tensor], model: GptOssTarget, device, dtype,
                         keep_fp8: bool = False) -> dict[str, torch.Tensor]:
    """This rank's HF tensors -> module names: ModelOpt FP8 / NVFP4 linears dequantised (quant.dequantize;
    ``keep_fp8`` is not taken: gpt-oss runs no FP8 GEMMs), ``model.`` prefix dropped, q/k/v fused into qkv_proj,
    MXFP4 experts kept packed (Mxfp4Experts) or dequantised (on ``device``, to ``dtype``: the host never holds
    the bf16 copy)."""
    sd = {name.removeprefix("model."): t for name, t in quant.dequantize(raw, dtype).items()}
    for i, layer in enumerate(model.layers):
        a = f"layers.{i}.self_attn."
        for kind in ("weight", "bias"):
            qkv = [sd.pop(f"{a}{p}_proj.{kind}", None) for p in "qkv"]
            if all(t is not None for t in qkv):
                sd[f"{a}qkv_proj.{kind}"] = torch.cat(qkv)
            elif kind == "weight" or any(t is not None for t in qkv) or model.config.attention_bias:
                missing_tensors([], [f"model.{a}{p}_proj.{kind}" for p, t in zip("qkv", qkv) if t is None],
                                   "checkpoint")
        e, experts = f"layers.{i}.mlp.experts.", layer.mlp.experts
        for proj in ("gate_up_proj", "down_proj"):
            if f"{e}{proj}_blocks" not in sd and f"{e}{proj}_scales" not in sd:
                if isinstance(experts, Mxfp4Experts):
                    raise DFlashError("mxfp4_moe", f"'triton' needs MXFP4 experts; the checkpoint has {e}{proj} "
                                      "unquantised", "use mxfp4_moe='dequant' (or 'auto') for this target")
                continue
            missing_tensors(sd, [f"{e}{proj}_blocks", f"{e}{proj}_scales"], "checkpoint (MXFP4 experts)")
            if isinstance(experts, Mxfp4Experts):  # kept packed: shard.py already read this rank's rows/groups
                scales = sd[f"{e}{proj}_scales"]
                top = int(scales.max()) if scales.numel() else 0
                if top > mxfp4.MAX_SCALE:
                    raise DFlashError(f"checkpoint: tensor model.{e}{proj}_scales", f"holds the E8M0 scale {top} "
                                      f"(2^{top - 127}), above {mxfp4.MAX_SCALE}, which the MXFP4 kernels do not "
                                      "decode", "the scales are corrupt: re-export it, or use mxfp4_moe='dequant'")
                continue
            w = mxfp4.dequantize(sd.pop(f"{e}{proj}_blocks"), sd.pop(f"{e}{proj}_scales"), dtype, device)
            if proj == "down_proj" and w.shape[1] == model.config.intermediate_size != experts.inter:
                # groups that could not be split on read (shard.py): keep this rank's channels now
                w = w[:, experts.moe_rank * experts.inter:(experts.moe_rank + 1) * experts.inter]
            sd[e + proj] = w
    return sd
