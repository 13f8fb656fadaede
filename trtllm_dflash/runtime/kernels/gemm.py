# SPDX-License-Identifier: Apache-2.0
"""Triton GEMMs for the decode path's few rows (M = requests x block tokens, up to kernels.GEMM_MAX_ROWS), with
the MLP's and the residual stream's elementwise work fused into the epilogue (RuntimeConfig.kernels).

  linear        out [M, N] = x [M, K] @ W[N, K]^T (+ bias) (+ residual): qkv_proj plain; o_proj and down_proj with
                the residual add in the epilogue, so the norm after them is a plain RMSNorm (one kernel per GEMM
                instead of GEMM + add).
  gate_up_silu  out [M, I] = SiLU(x @ Wg^T) * (x @ Wu^T) for gate_up_proj's weight [2I, K] (gate rows, then up
                rows, as the runtime fuses them at load): each program computes the gate and the up tile of the
                same output columns, so the [M, 2I] intermediate and the silu_mul kernel disappear.

One program per (BLOCK_M rows, BLOCK_N output columns) walks K: weights are read once per row tile,
accumulation is float32, the epilogue rounds once to the model dtype, and each GEMM is one kernel. A plain
projection can also split K over 2-4 programs per tile (``split``; ``split_for`` names the count that gives every SM
four programs): each stores its float32 partial, and the one that completes the tile (kernels/arrival.py) sums the
partials in slice order and runs the epilogue (deterministic; no second kernel); never in the batch-invariant mode,
never for the gated GEMM. The default launch of a plain projection at up to 16 rows (``plain_config``) takes
64-column tiles with BLOCK_K 128 and splits K as split_for says, where that keeps at least pick_config's programs in
flight: on an H200 at gpt-oss-120b's shapes and one row (benchmarks/results/gemm_split_h200/) that tile split 4 ways
was the fastest of every config and cuBLAS at o_proj and down_proj (10.4 and 8.3 us against pick_config's 14.4 and
10.9; qkv_proj 12.1 vs cuBLAS 11.2 and 14.4), while pick_config's own 16-column tiles got slower split (qkv_proj
17.3 us). Elsewhere (too few K steps to share, or a wide N that already fills the GPU: lm_head) it is pick_config's
tile unsplit. No default takes the FMA path below (BLOCK_M = 1); it is a launch option (``cfg``), which
trtllm_dflash/bench/gemm.py times with the other alternatives (at SmolLM2's narrow GEMMs and one row its 4-column
tiles were the fastest there: qkv_proj 2.6 vs 3.4 us, down_proj 3.7 vs 5.6, H200, gemm_plain_config_h200.json).
Two inner products: ``tl.dot`` tiles (BLOCK_M >= 16, tensor cores; rows past M are masked) or, with
BLOCK_M = 1 ("fma"), a broadcast multiply + row sum per row (a GEMV, no padded rows, any power-of-two BLOCK_N).

Batch-invariant mode (RuntimeConfig.batch_invariant, ``invariant=True``): every M, prefill's thousands of rows
included, runs in this kernel (never cuBLAS, whose tiles and split-K depend on M), so an AR step, a DFlash verify
and a prefill chunk must project a token to the same bits whatever tile their row count gets. The rule rests on a
GPU measurement, and the runtime's invariant mode depends on it: on Hopper, every tl.dot tile gives a row the same
bits, because each one adds the same k16 MMA products into one float32 accumulator in the same K order; BLOCK_M 16
and 32 (mma.sync) and 64 and 128 (wgmma), BLOCK_N, BLOCK_K 128 vs 256, the warps and the stages changed none of
1,024 rows' bits on an H200 at K = 4096 (benchmarks/results/gemm_tile_bits_h200.log); the check this rule must pass
at the real Qwen3-8B and SmolLM2 shapes, over BLOCK_M 16..128, BLOCK_N 16..128 and BLOCK_K 32..256 with this rule's
own tiles among them, is
tests/gpu/test_gemm_tile_bits_cuda.py::test_every_dot_tile_gives_a_row_the_bits_of_the_decode_tile. What does change
the order, and so is never used here for rows that must match: the FMA path (BLOCK_M = 1, a different inner
product), cuBLAS, and split-K (never in this mode). So invariant_config is pick_config's decode tile up to
INVARIANT_DECODE_ROWS rows and a compute-sized tile (128 rows, BLOCK_K 64) above: the invariant mode costs a decode
step what the default Triton tiles cost. The tile test measures bf16; tests/gpu/test_batch_invariance_cuda.py runs
the rule's own tiles across row counts in bf16, fp16 and float32 (tl.dot in IEEE precision). Rows past M are masked,
so a row's result does not depend on its place in the tile either. Triton's CPU interpreter does change the bits
with the tile (numpy's BLAS): there the tests pin the rule and compare with a tolerance; on a GPU they compare bits.

CUDA-graph safe: the grid and the config are functions of the shapes only (pick_config, invariant_config), no
autotuning and no host syncs. Under ``TRITON_INTERPRET=1`` (set before this module is imported) the kernels run on
CPU tensors, which the CPU tests use; the runtime calls them on CUDA tensors only. F.linear (cuBLAS) stays the
reference and the path for larger M (prefill) outside the batch-invariant mode and FP8 / float64 weights: the
routing rule is models/layers.py uses_gemm_kernel.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import GATED_GEMM_MAX_ROWS, GEMM_MAX_ROWS, num_sms, pow2
from .arrival import last_arrival, tile_counters

MAX_SMEM = 227 * 1024      # bytes of shared memory one block may use on an H100 (sm_90)
SMEM_BUDGET = 160 * 1024   # bytes of pipelined tiles per program (below MAX_SMEM: headroom for Triton)


@dataclass(frozen=True)
class Config:
    """Tile shape and launch parameters. block_m = 1 selects the FMA (GEMV) inner product; >= 16, tl.dot."""
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4

    def smem(self, gated: bool, elem: int) -> int:
        return self.num_stages * (self.block_m + (2 if gated else 1) * self.block_n) * self.block_k * elem


def dot_block_m(M: int) -> int:
    """BLOCK_M of the tl.dot tiles for M rows: padded to a power of two in 16..64."""
    return min(64, max(16, pow2(M)))


@functools.cache   # a pure function of its ints, called per GEMM launch (host time when not graph-replayed)
def _stages(block_m: int, block_n: int, block_k: int, gated: bool, elem: int) -> int:
    """The most pipeline stages (2..4) whose tiles fit SMEM_BUDGET (2 if none do)."""
    stages = 4
    while stages > 2 and Config(block_m, block_n, block_k, 4, stages).smem(gated, elem) > SMEM_BUDGET:
        stages -= 1
    return stages


WIDE_K = 2048   # K from which pick_config's decode rows take the 8B-and-up rule (below it: SmolLM2's 576)


@functools.cache   # a pure function of its ints, called per gated GEMM launch
def pick_config(M: int, N: int, K: int, gated: bool, elem: int, sms: int) -> Config:
    """The default tile for an [M, K] x [N, K]^T GEMM (N = output columns; I for gate_up_silu) on a GPU with
    ``sms`` SMs: tl.dot rows padded to 16..64; as many pipeline stages (<= 4) as fit the shared-memory budget. Every
    M <= 16 gets the same tiles; the batch-invariant mode takes these tiles up to INVARIANT_DECODE_ROWS rows (a row's
    bits do not depend on the tl.dot tile: module docstring). Columns and K step:
      - up to 16 rows and K >= WIDE_K (the decode GEMMs of the 8B-and-up models): 32 columns at BLOCK_K 128 for the
        gated GEMM, and for a plain one where 32 columns give every SM two programs (an lm_head); 16 columns at
        BLOCK_K 256 for the other plain ones (the batch-invariant mode's: the default launch splits K instead,
        plain_config). On an H200 at gpt-oss-120b's, its drafter's, Qwen3-8B's and its drafter's shapes and 1, 10
        and 16 rows, the 32 x 128 tile was the fastest gated tile or within 2% of it (gpt-oss-120b's gate_up at one
        row 13.0 us against 17.9 for the 16 x 256 tile it replaced, the drafter's 25.2 vs 35.3; cuBLAS + silu_mul
        12.8 and 27.2) and the lm_head's within 3% of the fastest (gpt-oss-120b at 10 rows 277 us against 298 for
        the 64 x 256 tile it replaced), benchmarks/results/gemm_split_h200/gemm_gated_lm_head_h200.json;
      - otherwise BLOCK_K 128 (a small K, e.g. SmolLM2's 576, wastes most of a 256 tile's last step: its lm_head
        ran 27.0 us at 256, 22.8 at 128, cuBLAS 23.4, H100) and the widest BLOCK_N in (64, 32, 16) that still gives
        two programs per SM.
    BLOCK_N is then halved while 2 stages of the tile would not fit a block's shared memory."""
    block_m = dot_block_m(M)
    m_tiles = -(-M // block_m)
    if M <= GEMM_MAX_ROWS and K >= WIDE_K:
        wide = gated or m_tiles * -(-N // 32) >= 2 * sms
        block_n, block_k = (32, 128) if wide else (16, 256)
    else:
        block_k = min(128, max(16, pow2(K)))
        block_n = 16
        for bn in (64, 32):
            if m_tiles * -(-N // bn) >= 2 * sms:
                block_n = bn
                break
    block_n = min(block_n, max(16, pow2(N)))
    # float32 with few SMs: a wide gated tile might not fit a block even in 2 stages, and the batch-invariant mode
    # takes these tiles for every GPU it runs on
    while block_n > 16 and Config(block_m, block_n, block_k, 4, 2).smem(gated, elem) > MAX_SMEM:
        block_n //= 2
    return Config(block_m, block_n, block_k, 4, _stages(block_m, block_n, block_k, gated, elem))


SPLIT_MIN_STEPS = 4   # BLOCK_K steps each K slice keeps at least (a split of fewer is mostly ramp-up)


def tiles(cfg: Config, M: int, N: int) -> int:
    """Output tiles (programs of an unsplit launch) of an M x N result under ``cfg``."""
    return -(-M // cfg.block_m) * -(-N // cfg.block_n)


def slice_k(K: int, block_k: int, split: int) -> int:
    """Inputs per K slice of a ``split``-way split: whole BLOCK_K steps, the last slice taking what remains."""
    return -(-(-(-K // block_k)) // split) * block_k


@functools.cache   # a pure function of its ints
def split_for(cfg: Config, M: int, N: int, K: int, sms: int) -> int:
    """K slices per output tile for a plain projection under ``cfg``: 1, or the fewest of 2 and 4 that give every SM
    four programs, as long as each slice keeps SPLIT_MIN_STEPS steps of BLOCK_K (gpt-oss-120b at one row: o_proj
    2880 x 4096 180 programs -> 4 slices, qkv 5120 x 2880 320 -> 2)."""
    programs, steps = tiles(cfg, M, N), -(-K // cfg.block_k)
    split = 1
    while split < 4 and programs * split < 4 * sms and steps >= 2 * split * SPLIT_MIN_STEPS:
        split *= 2
    return split


SPLIT_BLOCK_N, SPLIT_BLOCK_K = 64, 128   # the plain projections' split tile (plain_config)


@functools.cache   # a pure function of its ints, called per GEMM launch
def plain_config(M: int, N: int, K: int, elem: int, sms: int) -> tuple[Config, int]:
    """(tile, K slices) of the default launch of a plain projection (no gate; outside the batch-invariant mode): up
    to GEMM_MAX_ROWS rows the SPLIT_BLOCK_N x SPLIT_BLOCK_K tile split as split_for says, where it splits at all and
    keeps at least pick_config's programs in flight (gpt-oss-120b at one row: qkv_proj 80 tiles x 4 = pick_config's
    320, o_proj 45 x 4 = 180); else pick_config's tile, unsplit (SmolLM2's K = 576 has too few steps to share; its
    down_proj would fall from 36 programs to 18; an lm_head's columns already fill the GPU)."""
    base = pick_config(M, N, K, False, elem, sms)
    if M > GEMM_MAX_ROWS:
        return base, 1
    block_m, block_k = dot_block_m(M), min(SPLIT_BLOCK_K, max(16, pow2(K)))
    block_n = min(SPLIT_BLOCK_N, max(16, pow2(N)))
    cfg = Config(block_m, block_n, block_k, 4, _stages(block_m, block_n, block_k, False, elem))
    split = split_for(cfg, M, N, K, sms)
    if split > 1 and tiles(cfg, M, N) * split >= tiles(base, M, N):
        return cfg, split
    return base, 1


# Rows up to which the batch-invariant mode runs pick_config's decode tiles: GATED_GEMM_MAX_ROWS, the most rows the
# default path gives the Triton GEMM (gate_up + SiLU), so an AR step or a DFlash verify costs in the invariant mode
# what the default Triton tiles cost. Above it (prefill chunks, verifies of 9+ requests x 16 tokens) the weight
# re-reads of 64-row tiles dominate (qkv_proj at 1,024 rows: 2.7x cuBLAS on the default tile, H200): the compute tile.
INVARIANT_DECODE_ROWS = GATED_GEMM_MAX_ROWS
COMPUTE_BLOCK_M = 128
COMPUTE_BLOCK_K = 64   # the K step of Triton's own Hopper matmul configs: a 128 x 128 bf16 tile fits 4 stages (128 KB)


@functools.cache
def invariant_config(M: int, N: int, K: int, gated: bool, elem: int, sms: int) -> Config:
    """The batch-invariant mode's tile for M rows of [M, K] x [N, K]^T, a function of the shapes only (CUDA graphs):
    pick_config's up to INVARIANT_DECODE_ROWS rows, above them the compute tile: COMPUTE_BLOCK_M rows on 8 warps,
    BLOCK_K COMPUTE_BLOCK_K, 128 columns where that still gives every SM a program (else 64: a prefill of 256 rows
    at N = 4096 would leave half the SMs idle), fewer where two stages of it would not fit SMEM_BUDGET (float32
    gate_up), never more than N's power of two. Always tl.dot (BLOCK_M >= 16) and never split-K: the two things
    that, on the GPU, change a row's bits (module docstring)."""
    if M <= INVARIANT_DECODE_ROWS:
        return pick_config(M, N, K, gated, elem, sms)
    block_k = min(COMPUTE_BLOCK_K, max(16, pow2(K)))
    block_n = 128 if -(-M // COMPUTE_BLOCK_M) * -(-N // 128) >= sms else 64
    block_n = min(block_n, max(16, pow2(N)))
    while block_n > 16 and Config(COMPUTE_BLOCK_M, block_n, block_k, 8, 2).smem(gated, elem) > SMEM_BUDGET:
        block_n //= 2
    return Config(COMPUTE_BLOCK_M, block_n, block_k, 8, _stages(COMPUTE_BLOCK_M, block_n, block_k, gated, elem))


@functools.cache
def check_config(cfg: Config, gated: bool, elem: int) -> None:
    for name in ("block_m", "block_n", "block_k"):
        v = getattr(cfg, name)
        if v & (v - 1):
            raise ValueError(f"{name} {v}: tile sizes must be powers of two")
    if cfg.block_m != 1 and min(cfg.block_m, cfg.block_n, cfg.block_k) < 16:
        raise ValueError(f"{cfg}: tl.dot needs every tile dim >= 16 (block_m = 1 selects the FMA path)")
    if cfg.smem(gated, elem) > MAX_SMEM:
        raise ValueError(f"{cfg}: {cfg.smem(gated, elem)} bytes of pipelined tiles exceed the H100's 227 KB")


@triton.jit
def _load_w(w_ptrs, n_ok, k_ok, EVEN: tl.constexpr):
    if EVEN:   # whole tiles: unmasked loads vectorize without relying on the compiler's mask analysis
        w = tl.load(w_ptrs)
    else:
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    return w


@triton.jit
def _inner(x, w, acc, DOT: tl.constexpr, IEEE: tl.constexpr):
    """acc [BM, BN] += x [BM, BK] @ w [BN, BK]^T."""
    if DOT:
        if IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    else:
        acc += tl.sum(x[:, None, :].to(tl.float32) * w[None, :, :].to(tl.float32), 2)
    return acc


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, b_ptr, r_ptr, out_ptr, part_ptr, cnt_ptr, M, N, K, k_per, up_off,
                 s_xm, s_wn, s_rm, s_om,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GATED: tl.constexpr, BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
                 EVEN_W: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    k_lo = 0
    k_hi = K
    if SPLIT > 1:   # this program's K slice: k_per (a multiple of BLOCK_K) inputs from slice * k_per
        k_lo = tl.program_id(2) * k_per
        k_hi = tl.minimum(K, k_lo + k_per)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * s_xm + (k_lo + rk)[None, :]   # [BM, BK]
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * s_wn + (k_lo + rk)[None, :]   # [BN, BK] gate (or only) rows
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_ok = k0 + rk < k_hi
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _inner(x, _load_w(w_ptrs, n_ok, k_ok, EVEN_W), acc, DOT, IEEE)
        if GATED:   # up rows: the same columns, up_off rows further down the weight
            acc_up = _inner(x, _load_w(w_ptrs + up_off * s_wn, n_ok, k_ok, EVEN_W), acc_up, DOT, IEEE)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    mn_ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT > 1:   # partials [SPLIT, M, N] float32; the tile's last program sums them in slice order
        tile = rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(part_ptr + tl.program_id(2) * M * N + tile, acc, mask=mn_ok)
        cnt = cnt_ptr + pid_m * tl.num_programs(0) + pid_n
        if not last_arrival(cnt, SPLIT):
            return
        tl.store(cnt, 0)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for sl in range(SPLIT):
            acc += tl.load(part_ptr + sl * M * N + tile, mask=mn_ok, other=0.0, cache_modifier=".cg")
    if BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up
    if RESIDUAL:
        acc += tl.load(r_ptr + rm[:, None].to(tl.int64) * s_rm + rn[None, :], mask=mn_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + rm[:, None].to(tl.int64) * s_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=mn_ok)


def constexprs(cfg: Config, N: int, K: int, gated: bool, bias: bool, residual: bool, dtype: torch.dtype,
               split: int = 1) -> dict:
    """_gemm_kernel's compile-time arguments for a launch (trtllm_dflash/bench/gemm.py --compile_only compiles the
    same set for a GPU architecture without a GPU). A split's slices end on BLOCK_K steps, so EVEN_W holds for
    them as for the whole K."""
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GATED=gated, BIAS=bias,
                RESIDUAL=residual, EVEN_W=N % cfg.block_n == 0 and K % cfg.block_k == 0, DOT=cfg.block_m > 1,
                IEEE=dtype == torch.float32, SPLIT=split)


def _launch(x: torch.Tensor, weight: torch.Tensor, bias, residual, N: int, gated: bool, cfg: Config | None,
            invariant: bool = False, split: int | None = None):
    K = x.shape[-1]
    if weight.shape[-1] != K or weight.stride(-1) != 1 or x.stride(-1) != 1:
        raise ValueError(f"x [..., {K}] and weight {tuple(weight.shape)} must share K with contiguous rows")
    x2 = x.reshape(-1, K)                       # [M, K]
    M = x2.shape[0]
    elem = x.element_size()
    if cfg is None:
        sms = num_sms(x.device)
        if invariant or gated:
            cfg = (invariant_config if invariant else pick_config)(M, N, K, gated, elem, sms)
        else:
            cfg, default_split = plain_config(M, N, K, elem, sms)
            split = default_split if split is None else split
    check_config(cfg, gated, elem)
    split = split or 1   # a K split changes a row's sum order with the row count's tiles: never where bits must hold
    if split > 1 and (invariant or gated):
        raise ValueError("split-K is for plain projections outside the batch-invariant mode")
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    r2 = out
    if residual is not None:
        if residual.shape[:-1] != x.shape[:-1] or residual.shape[-1] != N or residual.stride(-1) != 1:
            raise ValueError(f"residual {tuple(residual.shape)} must be x's rows x {N} with contiguous rows")
        r2 = residual.reshape(-1, N)
    if M:
        grid = (triton.cdiv(N, cfg.block_n), triton.cdiv(M, cfg.block_m), split)
        k_per = slice_k(K, cfg.block_k, split)
        part, cnt = out, out   # unused without a split
        if split > 1:
            part = torch.empty(split, M, N, dtype=torch.float32, device=x.device)   # [split, M, N] partial sums
            cnt = tile_counters(x.device, grid[0] * grid[1])
        _gemm_kernel[grid](
            x2, weight, bias if bias is not None else weight, r2, out, part, cnt, M, N, K, k_per, N if gated else 0,
            x2.stride(0), weight.stride(0), r2.stride(0), out.stride(0),
            **constexprs(cfg, N, K, gated, bias is not None, residual is not None, x.dtype, split),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out.view(*x.shape[:-1], N)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None, cfg: Config | None = None, invariant: bool = False,
           split: int | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T (+ bias [N]) (+ residual [..., N]) -> [..., N] in x's dtype (F.linear's
    layout; float32 accumulation, one rounding at the end). ``cfg`` None = plain_config's tile and split, or
    invariant_config with ``invariant`` (the batch-invariant mode's tile: always tl.dot, never split-K). ``split``:
    K slices per tile (None: plain_config's where cfg is None, else none; 1: none; split_for names a count)."""
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias {tuple(bias.shape)} must be [{weight.shape[0]}]")
    return _launch(x, weight, bias, residual, weight.shape[0], False, cfg, invariant, split)


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, cfg: Config | None = None,
                 invariant: bool = False) -> torch.Tensor:
    """x [..., K], weight [2I, K] (gate rows then up rows) -> SiLU(x @ gate^T) * (x @ up^T) [..., I]: the
    gate_up GEMM and layers.silu_mul in one kernel."""
    if weight.shape[0] % 2:
        raise ValueError(f"gate_up weight {tuple(weight.shape)}: needs an even number of rows (gate, then up)")
    return _launch(x, weight, None, None, weight.shape[0] // 2, True, cfg, invariant)
