# SPDX-License-Identifier: Apache-2.0
"""Fused routed experts on MXFP4 weights (Triton, CUDA): gpt-oss's MoE without dequantising to memory.

The experts stay in the published layout (models/mxfp4.py): ``*_blocks`` uint8 [E, rows, K / 32, 16] (two E2M1
values per byte, low nibble first) and ``*_scales`` uint8 [E, rows, K / 32] (E8M0), rows = output features.
All on the device (no host sync, fixed grids: CUDA-graph safe). Two kernel paths, chosen by TileConfig.variant:

mma / swap (any token count), 3 kernels per MoE layer (+ 2 reductions at decode sizes):
  route     one program per local expert: counts every expert's (token, slot) pairs, then writes its own
            pairs in order into its BM-padded segment of ``sorted`` (padding -1) and its block ids into
            ``block_expert``; the first program writes the number of used blocks. Deterministic (no atomics).
  gate_up   grid (max blocks, I / BN): BM pair rows of one expert x BN intermediate channels; the gate (even)
            and up (odd) rows of the interleaved gate_up weight are two accumulators, so the clamped SwiGLU
            runs in the epilogue; the activation goes to a padded [blocks * BM, I] bf16 buffer.
  down      grid (max blocks, H / BN): the activation rows times down_proj, + bias, x routing weight, stored
            to the pair's row of y [N * k, H]; the k rows of a token are summed by the caller (no atomics).
  At decode sizes both GEMM kernels also split K (grid axis 2, ``split_for``) so the GPU holds enough programs
  to keep HBM busy; the float32 partial sums are then reduced in a fixed order by ``_swiglu_kernel`` (+ bias,
  SwiGLU) and ``_combine_kernel`` (+ bias, x routing weight, sum over the k rows).

gemv / tc (up to block_m tokens per call: decode and DFlash blocks), 2 kernels per MoE layer:
  gate_up   grid (min(E, N * k) expert slots, I / BN, split): each program finds its slot's expert and that
            expert's pairs itself from the call's expert ids (``_gemv_pairs``: no route kernel, no sorted array),
            so every distinct expert's weights are read once; SwiGLU epilogue into act [N * k, I].
  down      the same grid over H: float32 partials per pair; the program that completes a feature tile (a
            per-tile counter, ``kernels.arrival.last_arrival``) sums every token's k pairs in a fixed order and writes out [N, H].
  Split-K partials are summed in slice order by whichever program finishes a tile last: deterministic, and no
  separate reduction kernel.

Weights are dequantised in registers, never to memory. Three variants of the GEMM inner step (TileConfig.variant,
``_mx_tile``; default_tiles picks one per call by an explicit rule on the token count):
  mma   x @ W with tl.dot on BM >= 16 pair rows: ``tl.dot_scaled`` (Triton's own E2M1 upcast) or an explicit
        bit-level E2M1 decode + tl.dot (``dot_scaled=False``: the variant Triton's CPU interpreter runs);
  swap  W @ x^T: the same, with the weight's output rows as the MMA's M operand and the pair rows as its N;
  tc    the gemv kernels' grid and pairs, the K step on the tensor cores: the weight tile decoded in PTX straight
        to bf16 with its scale (``_tc_decode``: ~2.4 instructions per value, no conversion), one tl.dot against the
        expert's pair rows (N side, up to block_m: any pair count costs the same). Scales up to E8M0 192 (2^65).
  gemv  decode (inline PTX, ~2.9 instructions per E2M1 value, ``_gemv_decode``) and FMA in registers, one valid
        pair row at a time, each scale group's sum scaled once: no 16-row MMA tile to fill, padding rows skipped;
        an expert with one pair runs a K loop of its own (``_gemv_k_loop``); for up to GEMV_MAX_TOKENS tokens.
        With TileConfig.mma_from, an expert the call gives that many pairs or more runs tc's step instead,
        chosen per expert on the device (one launch either way).
mma / swap: blocks past the used count return at once, so the grid can be sized for the worst case:
min(E, N * k) + ceil(N * k / BM) blocks. gemv / tc: slots past the call's distinct experts return at once.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .kernels import num_sms, pow2
from .kernels.arrival import last_arrival, tile_counters


VARIANTS = ("mma", "swap", "gemv", "tc")
_MMA, _SWAP = tl.constexpr(0), tl.constexpr(1)   # MODE of the routed kernels: VARIANTS.index(variant)
GEMV_MAX_TOKENS = 16   # default_tiles' rule: GEMV up to this many tokens per call (see there)
GEMV_BLOCK_M = 16      # tc / gemv's pair block: one compiled kernel for every token count up to it


@dataclass(frozen=True)
class TileConfig:
    """How the two expert GEMMs tile. ``variant``:
      mma   x @ W: BM pair rows x BN outputs per tl.dot (BM >= 16; at decode most of the 16 rows are padding);
      swap  W @ x^T: the BN weight rows are the MMA's M side, the BM (>= 16) pair rows its N side;
      gemv  no MMA: the weight tile is decoded in registers once and FMA'd with each valid pair row in turn;
            BM (a power of two >= 2) must be >= the call's tokens, so each expert's pairs are one block (a clear
            error otherwise); padding rows cost nothing, so a large BM costs only registers;
      tc    gemv's grid and pair blocks, the weight tile decoded to bf16 and multiplied on the tensor cores
            (W @ pairs^T: BN gate / up channels = 2 BN rows in gate_up, BN rows in down; BM >= 16 pair columns).
    ``dot_scaled`` (mma, swap): Triton's tl.dot_scaled upcast, or the explicit E2M1 decode + tl.dot (the path
    Triton's CPU interpreter runs); gemv always decodes explicitly."""
    block_m: int = 16      # pair rows per program
    block_n: int = 64      # output channels per program (H100 sweep: 64 beat 32 at 1, 8 and 512 tokens)
    block_k: int = 128     # inputs per loop step (a power of two >= 32: whole scale groups)
    num_warps: int = 4
    num_stages: int = 4
    dot_scaled: bool = True
    split_k: int | None = None   # K slices per output tile (None: enough programs to fill the GPU, see split_for)
    variant: str = "mma"
    # gemv only: an expert given at least this many pairs by the call runs its K loop on the tensor cores (the tc
    # variant's step over its <= block_m pair rows) while experts with fewer keep gemv's FMA loops: the choice is
    # made per expert on the device, from the call's routing (0: never; a verify block under skewed routing gives
    # some experts several pairs, where gemv's FMA work per decoded weight grows with them)
    mma_from: int = 0
    down_block_k: int | None = None   # the down kernel's inputs per loop step (None: block_k; see default_tiles)

    @property
    def dn_block_k(self) -> int:
        return self.down_block_k or self.block_k

    def __post_init__(self):
        self.check()   # once per config (default_tiles' are cached), not per call

    def check(self) -> None:
        is_pow2 = lambda v: v > 0 and v & (v - 1) == 0  # noqa: E731
        mma = self.variant in ("mma", "swap", "tc")
        sizes = (self.block_m, self.block_n, self.block_k, self.dn_block_k)
        if (self.variant not in VARIANTS or not all(map(is_pow2, sizes))
                or min(self.block_k, self.dn_block_k) < 32
                or self.block_m < (16 if mma else 2) or self.block_n < (16 if mma else 1)
                or self.mma_from < 0 or (self.mma_from and (self.variant != "gemv" or self.mma_from < 2
                                                            or self.block_m < 16 or self.block_n < 16))):
            raise ValueError(f"{self}: variant is one of {VARIANTS}; block_m/n/k are powers of two, block_k >= 32 "
                             "(down_block_k likewise), and mma/swap need block_m, block_n >= 16 (tl.dot), gemv "
                             "block_m >= 2; mma_from is 0 or, for gemv with block_m, block_n >= 16, a pair count >= 2")


def split_for(tiles: TileConfig, programs: int, k_steps: int, sms: int) -> int:
    """Decode sizes give a few hundred programs of 20+ serial K steps each: latency-bound. Split K until the
    grid holds ~8 programs per SM (partial sums in float32, reduced in a fixed order: deterministic)."""
    if tiles.split_k is not None:
        return tiles.split_k
    split = 1
    while split < 8 and programs * split < 8 * sms and k_steps // (2 * split) >= 2:
        split *= 2
    return split


@functools.cache   # a pure function of its ints (TileConfig is frozen), called per MoE layer per step
def default_tiles(tokens: int, top_k: int, num_experts: int) -> TileConfig:
    """The variant and tiles for a call of ``tokens`` tokens x ``top_k`` experts over ``num_experts`` local ones.

    Rule: tokens <= GEMV_MAX_TOKENS -> gemv (block_m GEMV_BLOCK_M, no K split). A token's top-k experts are
    distinct, so no expert gets more than ``tokens`` pairs: each distinct expert is one pair block and its weights
    are read once per call whatever the routing, and one compiled kernel serves every token count. Above
    GEMV_MAX_TOKENS, the mma variant with BM grown by pairs per expert (verify batches and prefill, where the
    16-row tl.dot tile is full).
    Measured on an H200 (bench/gpt_oss_step.py --tile_sweep, one gpt-oss-120b MoE layer, graph replays, best
    tile of each): 1 token gemv 0.044 ms, the hybrid (mma_from 2) 0.049, tc 0.069, mma 0.102; 10 tokens under
    uniform routing (36 experts, ~1.1 pairs each) gemv 0.332, hybrid 0.395, tc 0.389, mma 0.638; under skewed
    routing (17 experts, ~2.4 pairs each) gemv 0.325, hybrid 0.235, tc 0.223, mma 0.311. tc's step wins where
    experts share a block's tokens, gemv's one-pair loop where they do not, and the hybrid that has both builds
    gemv's loop slower (1.10-1.19x): gemv stays the default, the uniform block being the documented worst case.
    One token (an AR step at batch 1) runs gate_up at BLOCK_K 128 and down at 256: in the 120b AR step (H200,
    profile) gate_up's 36 launches took 0.857 ms at 128 against 1.011 at 256, down's 0.657 against 0.498; one MoE
    layer alone, both at 128, 0.0451 vs 0.0497 ms. 10 tokens stay fastest at 256 in both (0.331 vs 0.346 ms); splitting
    K 2 or 4 ways was slower at both (0.054-0.063 at one token), and so was requesting one-pair experts' weight tiles 2
    or 3 K steps ahead instead of one (more bytes in flight; 0.0433 / 0.0441 vs 0.0407 ms at one token, git 44368aa,
    benchmarks/results/mxfp4_decode_h200/gemv_one_token/)."""
    if tokens <= GEMV_MAX_TOKENS:
        return TileConfig(variant="gemv", block_m=GEMV_BLOCK_M, block_n=32, block_k=128 if tokens == 1 else 256,
                          down_block_k=256, split_k=1)
    per_expert = tokens * top_k / max(1, num_experts)
    return TileConfig(block_m=16 if per_expert <= 16 else 32 if per_expert <= 48 else 64)


@functools.cache   # a pure function of a bool (TileConfig is frozen), called per MoE layer per step
def invariant_tiles(cuda: bool) -> TileConfig:
    """The batch-invariant mode's tiles (RuntimeConfig.batch_invariant), one for every token count: a pair row's
    result may depend on nothing but its own token and expert. default_tiles' rule changes the variant (gemv's FMA
    order against mma's tl.dot), block_m and the split of K with the call's token count, and each of those changes
    a row's float32 sums. Here: the mma variant at block_m 16 (a pair's row block holds whichever other pairs share
    its expert; tl.dot computes each row alike whatever the others are), no split of K (one float32 sum per output
    in K order), so the [N * k, H] pair rows are rounded to x's dtype and the k rows of a token summed in slot
    order, at every size. The cost is the decode sizes' speed (gemv and split-K are what make them fast).
    ``cuda``: tl.dot_scaled there; Triton's interpreter runs the explicit E2M1 decode."""
    return TileConfig(variant="mma", block_m=16, block_n=64, block_k=128, split_k=1, dot_scaled=cuda)


@triton.jit
def _route_kernel(ids_ptr, P, first, num_local, sorted_ptr, block_expert_ptr, num_blocks_ptr,
                  BM: tl.constexpr, EB: tl.constexpr, CP: tl.constexpr):
    e = tl.program_id(0)
    eo = tl.arange(0, EB)
    counts = tl.zeros([EB], dtype=tl.int32)
    for p0 in range(0, P, CP):                       # every local expert's count (P is small: N * k)
        po = p0 + tl.arange(0, CP)
        loc = tl.load(ids_ptr + po, mask=po < P, other=-1).to(tl.int32) - first
        ok = (po < P) & (loc >= 0) & (loc < num_local)
        counts += tl.histogram(tl.where(ok, loc, 0), EB, mask=ok)
    padded = (counts + BM - 1) // BM * BM
    start = tl.sum(tl.where(eo < e, padded, 0), axis=0)
    mine_n = tl.sum(tl.where(eo == e, counts, 0), axis=0)
    mine_padded = tl.sum(tl.where(eo == e, padded, 0), axis=0)
    if e == 0:
        tl.store(num_blocks_ptr, tl.sum(padded, axis=0) // BM)
    seen = 0
    for p0 in range(0, P, CP):                       # this expert's pairs, in pair order
        po = p0 + tl.arange(0, CP)
        loc = tl.load(ids_ptr + po, mask=po < P, other=-1).to(tl.int32) - first
        mine = (po < P) & (loc == e)
        m32 = mine.to(tl.int32)
        rank = seen + tl.cumsum(m32, axis=0) - 1
        tl.store(sorted_ptr + start + rank, po, mask=mine)
        seen += tl.sum(m32, axis=0)
    pad = tl.arange(0, BM)
    tl.store(sorted_ptr + start + mine_n + pad, -1, mask=mine_n + pad < mine_padded)
    for b0 in range(0, mine_padded // BM, CP):
        bo = b0 + tl.arange(0, CP)
        tl.store(block_expert_ptr + start // BM + bo, e, mask=bo < mine_padded // BM)


@triton.jit
def _e2m1_scaled(nib, scale):
    """E2M1 codes (int32, 0..15) times float32 scales -> float32, exactly (sign bit 3, exponent 2, mantissa 1)."""
    em = nib & 7
    ex = em >> 1
    man = em & 1
    bits = tl.where(ex > 0, ((ex + 126) << 23) | (man << 22), man * 0x3F000000)  # 0x3F000000 = 0.5 (subnormal)
    bits = bits | ((nib & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * scale


@triton.jit
def _e2m1x2_f16(t):
    """Two E2M1 codes per int32 (bits 0..3 and 16..19, zeros elsewhere) -> two fp16 bit patterns in one int32
    (low and high half), each the E2M1 value x 2^-14, exactly, with ~4 integer ops for the two: the code's
    exponent and mantissa bits go to the bottom of the fp16 exponent and the top of its mantissa, its sign to the
    fp16 sign (code 1 = 0.5 becomes the fp16 subnormal 2^-15, which the fp16 -> fp32 conversion keeps). The
    caller's scale carries the 2^14 back (``_scale_x2p14``). Both halves move with the same shifts, so every
    integer op decodes two values: the gemv variant's integer ops per weight bound its bandwidth."""
    return ((t & 0x00070007) << 9) | ((t & 0x00080008) << 12)


@triton.jit
def _f16_halves(v):
    """int32 holding two fp16 bit patterns -> (low half, high half) as float32."""
    lo = v.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (v >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _scale_x2p14(s):
    """E8M0 scales (int32) -> float32 2^(s - 127) x 2^14 (the ``_e2m1x2_f16`` offset), built from its exponent bits.
    Exact for s <= 240; larger scales (2^114 and up; 255 is E8M0's NaN) are outside what this variant decodes."""
    return ((s + 14) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _mx_tile(acc, a_ptr, a_off, w_rows, s_rows, w_ok, k0, K,
             BK: tl.constexpr, MODE: tl.constexpr, DOT_SCALED: tl.constexpr, CDT: tl.constexpr):
    """One BK step of acc += A[rows, k0:k0+BK] @ dequant(W)[k0:k0+BK, cols] on the MMA (variants mma, swap).

    a_off [BM] int64: element offsets of the A rows from a_ptr, -1 for padding rows; w_rows / s_rows [BN]: the
    byte / scale row starts of the BN output rows, w_ok [BN] their mask. acc is [BM, BN] for MODE _MMA, [BN, BM]
    for _SWAP (the weight is the MMA's M operand: its output rows fill the 64-row instruction that 1..16 pair
    rows would waste). CDT: the MMA operand type (bf16 on CUDA; float32 in Triton's CPU interpreter, where numpy
    has no bf16)."""
    a_ok = a_off >= 0
    a_row = a_ptr + tl.where(a_ok, a_off, 0)
    if DOT_SCALED:
        kk = k0 + tl.arange(0, BK)
        kb = k0 // 2 + tl.arange(0, BK // 2)
        ks = k0 // 32 + tl.arange(0, BK // 32)
        s = tl.load(s_rows[:, None] + ks[None, :], mask=w_ok[:, None] & (ks < K // 32)[None, :], other=127)  # [BN, BK/32]
        if MODE == _SWAP:
            w = tl.load(w_rows[:, None] + kb[None, :], mask=w_ok[:, None] & (kb < K // 2)[None, :], other=0)  # [BN, BK/2]
            a = tl.load(a_row[None, :] + kk[:, None], mask=a_ok[None, :] & (kk < K)[:, None], other=0.0)     # [BK, BM]
            acc = tl.dot_scaled(w, s, "e2m1", a.to(tl.bfloat16), None, "bf16", acc)
        else:
            w = tl.load(w_rows[None, :] + kb[:, None], mask=w_ok[None, :] & (kb < K // 2)[:, None], other=0)  # [BK/2, BN]
            a = tl.load(a_row[:, None] + kk[None, :], mask=a_ok[:, None] & (kk < K)[None, :], other=0.0)     # [BM, BK]
            acc = tl.dot_scaled(a.to(tl.bfloat16), None, "bf16", w, s, "e2m1", acc)
    else:
        # even inputs meet low nibbles, odd inputs high nibbles: two dots, no interleave of the weights
        j = tl.arange(0, BK // 2)
        ke = k0 + 2 * j
        kb = k0 // 2 + j
        if MODE == _SWAP:
            wm = w_ok[:, None] & (kb < K // 2)[None, :]
            w = tl.load(w_rows[:, None] + kb[None, :], mask=wm, other=0).to(tl.int32)                 # [BN, BK/2]
            s = tl.load(s_rows[:, None] + (kb // 16)[None, :], mask=wm, other=127).to(tl.int32)
            a_even = tl.load(a_row[None, :] + ke[:, None], mask=a_ok[None, :] & (ke < K)[:, None], other=0.0)   # [BK/2, BM]
            a_odd = tl.load(a_row[None, :] + ke[:, None] + 1, mask=a_ok[None, :] & (ke + 1 < K)[:, None], other=0.0)
        else:
            wm = w_ok[None, :] & (kb < K // 2)[:, None]
            w = tl.load(w_rows[None, :] + kb[:, None], mask=wm, other=0).to(tl.int32)                 # [BK/2, BN]
            s = tl.load(s_rows[None, :] + (kb // 16)[:, None], mask=wm, other=127).to(tl.int32)
            a_even = tl.load(a_row[:, None] + ke[None, :], mask=a_ok[:, None] & (ke < K)[None, :], other=0.0)   # [BM, BK/2]
            a_odd = tl.load(a_row[:, None] + ke[None, :] + 1, mask=a_ok[:, None] & (ke + 1 < K)[None, :], other=0.0)
        scale = (s << 23).to(tl.float32, bitcast=True)                                               # 2^(s - 127)
        lo = _e2m1_scaled(w & 15, scale).to(CDT)
        hi = _e2m1_scaled(w >> 4, scale).to(CDT)
        if MODE == _SWAP:
            acc = tl.dot(lo, a_even.to(CDT), acc)
            acc = tl.dot(hi, a_odd.to(CDT), acc)
        else:
            acc = tl.dot(a_even.to(CDT), lo, acc)
            acc = tl.dot(a_odd.to(CDT), hi, acc)
    return acc


@triton.jit
def _gemv_load(w_rows, s_rows, w_ok, k0, k_end, BK: tl.constexpr):
    """The packed weights of inputs k0 .. k0 + BK as int32 words [BK / 32, BN, 4] (scale group, output row, the
    group's 4 words = 16 bytes = 32 E2M1 values) and their scales [BK / 32, BN] uint8; masked at k_end (a multiple
    of 32): nothing is read past it, so the caller may prefetch one step beyond its K slice. Groups lead so that
    Triton's coalescing spreads a warp's lanes over 8 groups x 4 rows (whole 128-byte lines per row) and its
    warps over rows: the sum over groups stays inside a warp (shuffles, no shared memory)."""
    g = k0 // 32 + tl.arange(0, BK // 32)
    gm = (g < k_end // 32)[:, None] & w_ok[None, :]                               # [G, BN]
    words = w_rows.to(tl.pointer_type(tl.int32))                                  # row starts are 16-byte aligned
    w = tl.load(words[None, :, None] + (g * 4)[:, None, None] + tl.arange(0, 4)[None, None, :],
                mask=gm[:, :, None], other=0)
    s = tl.load(s_rows[None, :] + g[:, None], mask=gm, other=0)
    return w, s


# One int32 word of an MXFP4 row holds inputs 8w .. 8w + 7 as nibbles 0..7. Nibbles j and j + 4 sit 16 bits
# apart, so one shift and two masks place both at once as the fp16 pattern of their E2M1 value x 2^-14
# (``_e2m1x2_f16``'s placement); cvt.f32.f16 widens each half exactly. 15 integer ops and 8 conversions per
# word (~2.9 per value), fewer than Triton's lowering of the same tl ops (which adds byte shuffles and 16-bit
# truncations; benchmarks/results/mxfp4_sm90_loop_cost.json has the counts before and after).
_E2M1X8_F32 = tl.constexpr("""
{
.reg .b32 a, b, p;
.reg .b16 l, h;
shl.b32 a, $8, 9; shl.b32 b, $8, 12; and.b32 a, a, 0x0E000E00; lop3.b32 p, a, b, 0x80008000, 0xF8;
mov.b32 {l, h}, p; cvt.f32.f16 $0, l; cvt.f32.f16 $4, h;
shl.b32 a, $8, 5; shl.b32 b, $8, 8; and.b32 a, a, 0x0E000E00; lop3.b32 p, a, b, 0x80008000, 0xF8;
mov.b32 {l, h}, p; cvt.f32.f16 $1, l; cvt.f32.f16 $5, h;
shl.b32 a, $8, 1; shl.b32 b, $8, 4; and.b32 a, a, 0x0E000E00; lop3.b32 p, a, b, 0x80008000, 0xF8;
mov.b32 {l, h}, p; cvt.f32.f16 $2, l; cvt.f32.f16 $6, h;
shr.b32 a, $8, 3; and.b32 a, a, 0x0E000E00; lop3.b32 p, a, $8, 0x80008000, 0xF8;
mov.b32 {l, h}, p; cvt.f32.f16 $3, l; cvt.f32.f16 $7, h;
}
""")


@triton.jit
def _gemv_decode(w, ASM: tl.constexpr):
    """w [G, BN, 4] int32 words -> v0..v7 [G, BN, 4] float32: nibble j of every word (input 8 * word + j) as its
    E2M1 value x 2^-14, unscaled (the caller applies each group's scale to the group's sum). ASM: the PTX above
    (CUDA); else the same values from tl ops (Triton's CPU interpreter runs no inline assembly)."""
    if ASM:
        v = tl.inline_asm_elementwise(_E2M1X8_F32, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w],
                                      dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    else:
        v0, v4 = _f16_halves(_e2m1x2_f16(w))
        v1, v5 = _f16_halves(_e2m1x2_f16(w >> 4))
        v2, v6 = _f16_halves(_e2m1x2_f16(w >> 8))
        v3, v7 = _f16_halves(_e2m1x2_f16(w >> 12))
        v = (v0, v1, v2, v3, v4, v5, v6, v7)
    return v


@triton.jit
def _gemv_group_sums(v, x3):
    """One row's sum over each scale group: v (``_gemv_decode``) [G, BN, 4] x8, x3 [G, 4, 8] float32 (each word's 8
    inputs in order) -> [G, BN], split in registers into the 8 [G, 4] slices (one FMA chain per group and row)."""
    G: tl.constexpr = x3.shape[0]
    x_e, x_o = tl.split(tl.reshape(x3, [G, 4, 4, 2]))                            # inputs 0,2,4,6 / 1,3,5,7
    x_04, x_26 = tl.split(tl.reshape(x_e, [G, 4, 2, 2]))
    x_15, x_37 = tl.split(tl.reshape(x_o, [G, 4, 2, 2]))
    x0, x4 = tl.split(x_04)
    x2, x6 = tl.split(x_26)
    x1, x5 = tl.split(x_15)
    x3_, x7 = tl.split(x_37)
    acc = v[0] * x0[:, None, :] + v[1] * x1[:, None, :] + v[2] * x2[:, None, :] + v[3] * x3_[:, None, :]
    acc += v[4] * x4[:, None, :] + v[5] * x5[:, None, :] + v[6] * x6[:, None, :] + v[7] * x7[:, None, :]
    return tl.sum(acc, axis=2)


@triton.jit
def _gemv_x(a_ptr, off, k0, k_end, BK: tl.constexpr):
    """One row's inputs k0 .. k0 + BK from element offset ``off`` of a_ptr as float32 [G, 4, 8] (scale group, word,
    input in the word), zeros past k_end."""
    g = k0 // 32 + tl.arange(0, BK // 32)
    kx = (g * 32)[:, None, None] + (tl.arange(0, 4) * 8)[None, :, None] + tl.arange(0, 8)[None, None, :]
    return tl.load(a_ptr + off + kx, mask=(g < k_end // 32)[:, None, None], other=0.0).to(tl.float32)


@triton.jit
def _gemv_fma(acc_a, acc_b, wa, sa, wb, sb, a_ptr, a_off, nvalid, k0, k_end,
              TWO: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, ASM: tl.constexpr):
    """acc_a [BM, BN] += A[rows, k0:k0+BK] @ dequant(wa, sa), and the same for b when TWO (gate and up share each
    row of A), without the MMA: the tiles are decoded once, then each of the first ``nvalid`` rows (a_off [BM]:
    element offsets from a_ptr) is loaded once and FMA'd with them; padding rows cost nothing. Each scale group's
    sum is scaled once (one multiply per 32 values, not one per value)."""
    va = _gemv_decode(wa, ASM)
    sca = _scale_x2p14(sa.to(tl.int32))                                          # [G, BN]
    if TWO:
        vb = _gemv_decode(wb, ASM)
        scb = _scale_x2p14(sb.to(tl.int32))
    ar = tl.arange(0, BM)
    for r in range(nvalid):
        x3 = _gemv_x(a_ptr, tl.sum(tl.where(ar == r, a_off, 0), axis=0), k0, k_end, BK)   # row r's inputs
        row_a = tl.sum(_gemv_group_sums(va, x3) * sca, axis=0)                    # [BN]
        acc_a = tl.where((ar == r)[:, None], acc_a + row_a[None, :], acc_a)
        if TWO:
            row_b = tl.sum(_gemv_group_sums(vb, x3) * scb, axis=0)
            acc_b = tl.where((ar == r)[:, None], acc_b + row_b[None, :], acc_b)
    return acc_a, acc_b


@triton.jit
def _gemv_tiles(wa_rows, sa_rows, wb_rows, sb_rows, w_ok, k0, k_end, TWO: tl.constexpr, BK: tl.constexpr):
    """One K step's tiles: a's words and scales, and b's when TWO (else a's again)."""
    wa, sa = _gemv_load(wa_rows, sa_rows, w_ok, k0, k_end, BK)
    wb, sb = wa, sa
    if TWO:
        wb, sb = _gemv_load(wb_rows, sb_rows, w_ok, k0, k_end, BK)
    return wa, sa, wb, sb


@triton.jit
def _gemv_k_loop(a_ptr, a_off, count, wa_rows, sa_rows, wb_rows, sb_rows, w_ok, k_lo, k_hi,
                 TWO: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ASM: tl.constexpr):
    """-> acc_a, acc_b [BM, BN]: inputs k_lo .. k_hi of the first ``count`` rows times the weight tiles (b when
    TWO), the next step's tiles requested before this step's FMAs. A call that gives this expert one pair (every
    expert of a batch-1 step) keeps that row's sums per scale group until the slice ends: no reduction across lanes
    and no row select per K step."""
    ar = tl.arange(0, BM)
    wa, sa, wb, sb = _gemv_tiles(wa_rows, sa_rows, wb_rows, sb_rows, w_ok, k_lo, k_hi, TWO, BK)
    if count == 1:
        off = tl.sum(tl.where(ar == 0, a_off, 0), axis=0)
        ga = tl.zeros([BK // 32, BN], dtype=tl.float32)
        gb = tl.zeros([BK // 32, BN], dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            nxt = _gemv_tiles(wa_rows, sa_rows, wb_rows, sb_rows, w_ok, k0 + BK, k_hi, TWO, BK)
            x3 = _gemv_x(a_ptr, off, k0, k_hi, BK)
            ga += _gemv_group_sums(_gemv_decode(wa, ASM), x3) * _scale_x2p14(sa.to(tl.int32))
            if TWO:
                gb += _gemv_group_sums(_gemv_decode(wb, ASM), x3) * _scale_x2p14(sb.to(tl.int32))
            wa, sa, wb, sb = nxt
        acc_a = tl.where((ar == 0)[:, None], tl.sum(ga, axis=0)[None, :], 0.0)
        acc_b = tl.where((ar == 0)[:, None], tl.sum(gb, axis=0)[None, :], 0.0)
    else:
        acc_a, acc_b = _gemv_rows_loop(a_ptr, a_off, count, wa, sa, wb, sb, wa_rows, sa_rows, wb_rows, sb_rows,
                                       w_ok, k_lo, k_hi, TWO, BM, BN, BK, ASM)
    return acc_a, acc_b


@triton.jit
def _gemv_rows_loop(a_ptr, a_off, count, wa, sa, wb, sb, wa_rows, sa_rows, wb_rows, sb_rows, w_ok, k_lo, k_hi,
                    TWO: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ASM: tl.constexpr):
    """The K loop over an expert's ``count`` (> 1) pair rows on FMAs: wa .. sb are the first step's tiles, each
    next step's requested before this step's FMAs."""
    acc_a = tl.zeros([BM, BN], dtype=tl.float32)
    acc_b = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        nxt = _gemv_tiles(wa_rows, sa_rows, wb_rows, sb_rows, w_ok, k0 + BK, k_hi, TWO, BK)
        acc_a, acc_b = _gemv_fma(acc_a, acc_b, wa, sa, wb, sb, a_ptr, a_off, count, k0, k_hi, TWO, BM, BK, ASM)
        wa, sa, wb, sb = nxt
    return acc_a, acc_b


# The tc variant's decode: one int32 word (inputs 8w .. 8w + 7 as nibbles 0..7) and a bf16x2 multiplier m (2^(s - 65)
# in both halves) -> its 8 values as bf16, E2M1 x 2^(s - 191). Nibbles j and j + 4 sit 16 bits apart, so one shift
# and two masks place both at the bottom of a bf16 (value x 2^-126; code 1 = 0.5 becomes the bf16 subnormal 2^-127)
# and one packed multiply by m scales both, exactly (bf16 ops keep subnormals): 15 integer ops and 4 multiplies per
# word. The caller multiplies x by 2^64 to match (the weights' 2^-64 keeps scales up to s = 192 in bf16's range).
_E2M1X8_BF16 = tl.constexpr("""
{
.reg .b32 a, b, p, q, z;
mov.b32 z, 0x80008000;
shl.b32 a, $8, 6; shl.b32 b, $8, 12; and.b32 a, a, 0x01C001C0; lop3.b32 p, a, b, 0x80008000, 0xF8;
fma.rn.bf16x2 q, p, $9, z; mov.b32 {$0, $4}, q;
shl.b32 a, $8, 2; shl.b32 b, $8, 8; and.b32 a, a, 0x01C001C0; lop3.b32 p, a, b, 0x80008000, 0xF8;
fma.rn.bf16x2 q, p, $9, z; mov.b32 {$1, $5}, q;
shr.b32 a, $8, 2; shl.b32 b, $8, 4; and.b32 a, a, 0x01C001C0; lop3.b32 p, a, b, 0x80008000, 0xF8;
fma.rn.bf16x2 q, p, $9, z; mov.b32 {$2, $6}, q;
shr.b32 a, $8, 6; and.b32 a, a, 0x01C001C0; lop3.b32 p, a, $8, 0x80008000, 0xF8;
fma.rn.bf16x2 q, p, $9, z; mov.b32 {$3, $7}, q;
}
""")
TC_X_SCALE = tl.constexpr(2.0 ** 64)   # the tc variant's x multiplier (its weights carry 2^-64)


@triton.jit
def _tc_decode(w, s, ASM: tl.constexpr):
    """w [R, W] int32 words, s [R, W] int32 E8M0 scale of each word's group -> 8 tensors [R, W] (nibble i of each
    word: input 8 * word + i) of E2M1 x 2^(s - 191): bf16 from the PTX above (CUDA), float32 from tl ops (Triton's
    CPU interpreter runs no inline assembly; the values are the same)."""
    if ASM:
        m = (s + 62) << 7                                                          # bf16 bits of 2^(s - 65)
        v = tl.inline_asm_elementwise(_E2M1X8_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [w, m | (m << 16)],
                                      dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        f = tl.where(s > 64, ((s - 64) << 23).to(tl.float32, bitcast=True), 0.0)  # 2^(s - 191) (below: ~0)
        v = (_e2m1_scaled(w & 15, f), _e2m1_scaled((w >> 4) & 15, f), _e2m1_scaled((w >> 8) & 15, f),
             _e2m1_scaled((w >> 12) & 15, f), _e2m1_scaled((w >> 16) & 15, f), _e2m1_scaled((w >> 20) & 15, f),
             _e2m1_scaled((w >> 24) & 15, f), _e2m1_scaled((w >> 28) & 15, f))
    return v


@triton.jit
def _join8(v):
    """8 tensors [R, W] -> [R, W, 2, 2, 2], registers in the order v[0] .. v[7] (join's new axis is the fastest in
    registers, so a thread's 8 values of a word are contiguous: 16-byte stores on the way to the MMA); its flat
    position 4a + 2b + c within a word holds v[4c + 2b + a] (the 3-bit reversal, which x's tile repeats)."""
    return tl.join(tl.join(tl.join(v[0], v[1]), tl.join(v[2], v[3])), tl.join(tl.join(v[4], v[5]), tl.join(v[6], v[7])))


@triton.jit
def _tc_k_loop(a_ptr, a_off, w_rows, s_rows, w_ok, k_lo, k_hi, R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
               ASM: tl.constexpr, CDT: tl.constexpr, SCALED_A: tl.constexpr):
    """-> acc [R, BM] float32: weight rows w_rows / s_rows [R] (byte / scale row starts, w_ok their mask) times the
    BM pair rows of A (a_off [BM] element offsets from a_ptr, -1 padding) over inputs k_lo .. k_hi (multiples of
    32), on the tensor cores: each step decodes the [R, BK] weight tile to scaled bf16 (``_tc_decode``) and runs one
    tl.dot against the pairs' inputs, loaded in the tile's k order and times TC_X_SCALE (SCALED_A: A holds them so
    already, in CDT: the gate_up kernel's act). Any pair count up to BM costs the same (the MMA's N side)."""
    W: tl.constexpr = BK // 8
    G: tl.constexpr = BK // 32
    words = w_rows.to(tl.pointer_type(tl.int32))                                  # row starts are 16-byte aligned
    wd = tl.arange(0, W)
    g = tl.arange(0, G)
    kk = tl.arange(0, BK)
    a_ok = a_off >= 0
    # A's rows start at multiples of 32 elements (its row stride is the K of one of the two GEMMs): 16-byte loads
    a_row = a_ptr + tl.multiple_of(tl.where(a_ok, a_off, 0), 32)
    # whole scale groups (K is a multiple of 32, slices of BK): the masks at k_hi then hold for a group's 16 bytes
    # of weights and its 32 inputs alike, and the loads stay vectorised
    k_lo = tl.multiple_of(k_lo, 32)
    k_hi = tl.multiple_of(k_hi, 32)
    acc = tl.zeros([R, BM], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        w = tl.load(words[:, None] + (k0 // 8 + wd)[None, :],
                    mask=w_ok[:, None] & (k0 + 32 * (wd // 4) < k_hi)[None, :], other=0)   # [R, W]
        s = tl.load(s_rows[:, None] + (k0 // 32 + g)[None, :], mask=w_ok[:, None] & (k0 + 32 * g < k_hi)[None, :],
                    other=0).to(tl.int32)                                         # [R, G]
        s = tl.reshape(tl.broadcast_to(s[:, :, None], [R, G, 4]), [R, W])         # each word's group scale
        a = tl.reshape(_join8(_tc_decode(w, s, ASM)), [R, BK])
        x = tl.load(a_row[:, None] + (k0 + kk)[None, :], mask=a_ok[:, None] & (k0 + 32 * (kk // 32) < k_hi)[None, :],
                    other=0.0)
        x = tl.reshape(tl.permute(tl.reshape(x, [BM, W, 2, 2, 2]), (0, 1, 4, 3, 2)), [BM, BK])   # _join8's order
        if not SCALED_A:
            x = (x.to(tl.float32) * TC_X_SCALE).to(CDT)
        acc = tl.dot(a.to(CDT), tl.trans(x), acc)
    return acc


@triton.jit
def _tc_gate_up(x_ptr, a_off, w_rows, s_rows, w_ok, k_lo, k_hi, BN: tl.constexpr, BM: tl.constexpr,
                BK: tl.constexpr, ASM: tl.constexpr, CDT: tl.constexpr):
    """``_tc_k_loop`` over 2 BN interleaved gate / up rows (w_rows, s_rows [2 BN]) -> acc_g, acc_u [BM, BN]."""
    acc = _tc_k_loop(x_ptr, a_off, w_rows, s_rows, w_ok, k_lo, k_hi, 2 * BN, BM, BK, ASM, CDT, False)  # [2 BN, BM]
    acc_g, acc_u = tl.split(tl.permute(tl.reshape(acc, [BN, 2, BM]), (0, 2, 1)))
    return tl.trans(acc_g), tl.trans(acc_u)


@triton.jit
def _acc_zeros(BM: tl.constexpr, BN: tl.constexpr, MODE: tl.constexpr):
    if MODE == _SWAP:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    return acc


@triton.jit
def _rows_first(acc, MODE: tl.constexpr):
    """[BM, BN] whatever the orientation ``_mx_tile`` accumulated in."""
    if MODE == _SWAP:
        acc = tl.trans(acc)
    return acc


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, s_ptr, b_ptr, sorted_ptr, block_expert_ptr, num_blocks_ptr, act_ptr, part_ptr,
                    K, I, R, topk, limit, alpha, stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_be,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, MODE: tl.constexpr,
                    DOT_SCALED: tl.constexpr, SPLIT: tl.constexpr, CDT: tl.constexpr):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if pid_m >= tl.load(num_blocks_ptr):
        return
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = tl.load(sorted_ptr + pid_m * BM + tl.arange(0, BM))                   # pair ids, -1 = padding (last)
    valid = rows >= 0
    a_off = tl.where(valid, (rows // topk).to(tl.int64) * stride_xm, -1)        # the pairs' token rows of x
    c = pid_n * BN + tl.arange(0, BN)                                            # intermediate channels
    cm = c < I
    g_rows, u_rows = (2 * c).to(tl.int64), (2 * c + 1).to(tl.int64)
    wg = w_ptr + e * stride_we + g_rows * stride_wn
    wu = w_ptr + e * stride_we + u_rows * stride_wn
    sg = s_ptr + e * stride_se + g_rows * stride_sn
    su = s_ptr + e * stride_se + u_rows * stride_sn
    acc_g = _acc_zeros(BM, BN, MODE)
    acc_u = _acc_zeros(BM, BN, MODE)
    k_len = tl.cdiv(tl.cdiv(K, BK), SPLIT) * BK
    for k0 in range(pid_k * k_len, tl.minimum(pid_k * k_len + k_len, K), BK):
        acc_g = _mx_tile(acc_g, x_ptr, a_off, wg, sg, cm, k0, K, BK, MODE, DOT_SCALED, CDT)
        acc_u = _mx_tile(acc_u, x_ptr, a_off, wu, su, cm, k0, K, BK, MODE, DOT_SCALED, CDT)
    acc_g = _rows_first(acc_g, MODE)
    acc_u = _rows_first(acc_u, MODE)
    out_rows = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    if SPLIT > 1:  # partial sums [SPLIT, R, 2, I]; _swiglu_kernel adds them up
        m = valid[:, None] & cm[None, :]
        base = part_ptr + ((pid_k * R + out_rows[:, None]) * 2) * I + c[None, :]
        tl.store(base, acc_g, mask=m)
        tl.store(base + I, acc_u, mask=m)
        return
    _swiglu_store(acc_g, acc_u, b_ptr + e * stride_be, g_rows, u_rows, cm, valid, act_ptr, out_rows, c, I, limit, alpha)


@triton.jit
def _swiglu_store(acc_g, acc_u, bias_ptr, g_rows, u_rows, cm, valid, act_ptr, out_rows, c, I, limit, alpha,
                  out_scale=1.0):
    gate = acc_g + tl.load(bias_ptr + g_rows, mask=cm, other=0.0).to(tl.float32)[None, :]
    up = acc_u + tl.load(bias_ptr + u_rows, mask=cm, other=0.0).to(tl.float32)[None, :]
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    act = (up + 1.0) * gate * tl.sigmoid(gate * alpha) * out_scale
    tl.store(act_ptr + out_rows[:, None] * I + c[None, :], act.to(act_ptr.dtype.element_ty), mask=valid[:, None] & cm[None, :])


@triton.jit
def _gate_up_partials(part_ptr, rows, m, c, R, I, BM: tl.constexpr, BN: tl.constexpr, SPLIT):
    """The SPLIT float32 gate / up partial sums of rows [BM] x channels c [BN] (layout [SPLIT, R, 2, I]), added
    in slice order (deterministic). Read through L2 (.cg): in the gemv kernels other programs wrote them."""
    acc_g = tl.zeros([BM, BN], dtype=tl.float32)
    acc_u = tl.zeros([BM, BN], dtype=tl.float32)
    for sk in range(SPLIT):
        base = part_ptr + ((sk * R + rows[:, None]) * 2) * I + c[None, :]
        acc_g += tl.load(base, mask=m, other=0.0, cache_modifier=".cg")
        acc_u += tl.load(base + I, mask=m, other=0.0, cache_modifier=".cg")
    return acc_g, acc_u


@triton.jit
def _swiglu_kernel(part_ptr, b_ptr, sorted_ptr, block_expert_ptr, num_blocks_ptr, act_ptr, I, R, limit, alpha,
                   stride_be, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr):
    """Split-K gate_up: the SPLIT partial sums, in order, then bias and the clamped SwiGLU."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m >= tl.load(num_blocks_ptr):
        return
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    valid = tl.load(sorted_ptr + pid_m * BM + tl.arange(0, BM)) >= 0
    c = pid_n * BN + tl.arange(0, BN)
    cm = c < I
    out_rows = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    acc_g, acc_u = _gate_up_partials(part_ptr, out_rows, valid[:, None] & cm[None, :], c, R, I, BM, BN, SPLIT)
    _swiglu_store(acc_g, acc_u, b_ptr + e * stride_be, (2 * c).to(tl.int64), (2 * c + 1).to(tl.int64), cm, valid,
                  act_ptr, out_rows, c, I, limit, alpha)


@triton.jit
def _down_kernel(act_ptr, w_ptr, s_ptr, b_ptr, sorted_ptr, block_expert_ptr, num_blocks_ptr, rw_ptr, y_ptr,
                 K, H, P, stride_we, stride_wn, stride_se, stride_sn, stride_be,
                 HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, MODE: tl.constexpr,
                 DOT_SCALED: tl.constexpr, SPLIT: tl.constexpr, CDT: tl.constexpr):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if pid_m >= tl.load(num_blocks_ptr):
        return
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = tl.load(sorted_ptr + pid_m * BM + tl.arange(0, BM))
    valid = rows >= 0
    n = pid_n * BN + tl.arange(0, BN)                                            # hidden features
    nm = n < H
    a_off = tl.where(valid, (pid_m * BM + tl.arange(0, BM)).to(tl.int64) * K, -1)   # this block's act rows
    w = w_ptr + e * stride_we + n.to(tl.int64) * stride_wn
    s = s_ptr + e * stride_se + n.to(tl.int64) * stride_sn
    acc = _acc_zeros(BM, BN, MODE)
    k_len = tl.cdiv(tl.cdiv(K, BK), SPLIT) * BK
    for k0 in range(pid_k * k_len, tl.minimum(pid_k * k_len + k_len, K), BK):
        acc = _mx_tile(acc, act_ptr, a_off, w, s, nm, k0, K, BK, MODE, DOT_SCALED, CDT)
    acc = _rows_first(acc, MODE)
    pr = tl.where(valid, rows, 0).to(tl.int64)
    if SPLIT > 1:  # float32 partials [SPLIT, P, H]; _combine_kernel adds bias, weight and the k rows
        tl.store(y_ptr + (pid_k * P + pr[:, None]) * H + n[None, :], acc, mask=valid[:, None] & nm[None, :])
        return
    if HAS_BIAS:
        acc += tl.load(b_ptr + e * stride_be + n, mask=nm, other=0.0).to(tl.float32)[None, :]
    rw = tl.load(rw_ptr + pr, mask=valid, other=0.0).to(tl.float32)
    acc = acc * rw[:, None]
    tl.store(y_ptr + pr[:, None] * H + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=valid[:, None] & nm[None, :])


@triton.jit
def _combine_tokens(part_ptr, ids_ptr, rw_ptr, b_ptr, out_ptr, t0, N, n, nm, H, P, first, num_local, stride_be,
                    TOPK: tl.constexpr, HAS_BIAS: tl.constexpr, TB: tl.constexpr, BN: tl.constexpr, SPLIT):
    """out[t] = sum_j w[t, j] * (sum_s part[s, t * k + j] + bias[e]) over this rank's experts, for tokens
    t0 .. t0 + TB (masked to N) x features n [BN]; fixed order (deterministic); 0 for a token with no local pair."""
    t = t0 + tl.arange(0, TB)
    tm = t < N
    out = tl.zeros([TB, BN], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        pair = t * TOPK + j
        e = tl.load(ids_ptr + pair, mask=tm, other=-1).to(tl.int32) - first
        mine = tm & (e >= 0) & (e < num_local)
        m = mine[:, None] & nm[None, :]
        y = tl.zeros([TB, BN], dtype=tl.float32)
        for sk in range(SPLIT):
            y += tl.load(part_ptr + (sk * P + pair).to(tl.int64)[:, None] * H + n[None, :], mask=m, other=0.0,
                         cache_modifier=".cg")
        if HAS_BIAS:
            y += tl.load(b_ptr + tl.where(mine, e, 0).to(tl.int64)[:, None] * stride_be + n[None, :], mask=m,
                         other=0.0).to(tl.float32)
        out += tl.load(rw_ptr + pair, mask=mine, other=0.0).to(tl.float32)[:, None] * y
    tl.store(out_ptr + t.to(tl.int64)[:, None] * H + n[None, :], out.to(out_ptr.dtype.element_ty),
             mask=tm[:, None] & nm[None, :])


@triton.jit
def _combine_kernel(part_ptr, ids_ptr, rw_ptr, b_ptr, out_ptr, N, H, P, first, num_local, stride_be,
                    TOPK: tl.constexpr, HAS_BIAS: tl.constexpr, TB: tl.constexpr, BN: tl.constexpr,
                    SPLIT: tl.constexpr):
    """Split-K down (mma / swap): TB tokens x BN features per program."""
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    _combine_tokens(part_ptr, ids_ptr, rw_ptr, b_ptr, out_ptr, tl.program_id(0) * TB, N, n, n < H, H, P, first,
                    num_local, stride_be, TOPK, HAS_BIAS, TB, BN, SPLIT)


# ---- gemv: no route kernel, split-K reduced by the last program to finish a tile ---------------------------
@triton.jit
def _gemv_pairs(ids_ptr, P, first, num_local, slot, BM: tl.constexpr, EB: tl.constexpr, PB: tl.constexpr):
    """In-kernel routing (the call has at most a few dozen pairs, so every program reads them all): the call's
    ``slot``-th distinct local expert in id order, and its pairs. Returns e (int64), used (distinct local experts
    of the call), pairs [BM] int64 (e's pair ids in pair order, -1 after the last) and their count."""
    po = tl.arange(0, PB)
    loc = tl.load(ids_ptr + po, mask=po < P, other=-1).to(tl.int32) - first
    ok = (po < P) & (loc >= 0) & (loc < num_local)
    present = tl.histogram(tl.where(ok, loc, 0), EB, mask=ok) > 0                  # [EB]
    nth = tl.cumsum(present.to(tl.int32), axis=0) - 1
    is_slot = present & (nth == slot)
    e = tl.sum(tl.where(is_slot, tl.arange(0, EB), 0), axis=0)
    used = tl.sum(present.to(tl.int32), axis=0)
    mine = ok & (loc == e) & (tl.sum(is_slot.to(tl.int32), axis=0) > 0)          # [PB]
    rank = tl.cumsum(mine.to(tl.int32), axis=0) - 1
    hit = mine[None, :] & (rank[None, :] == tl.arange(0, BM)[:, None])            # [BM, PB]
    pairs = tl.sum(tl.where(hit, po[None, :] + 1, 0), axis=1).to(tl.int64) - 1   # [BM]
    return e.to(tl.int64), used, pairs, tl.sum(mine.to(tl.int32), axis=0)


@triton.jit
def _gemv_gate_up_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, act_ptr, part_ptr, cnt_ptr, P, first, num_local,
                         K, I, topk, limit, alpha, stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_be,
                         split, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EB: tl.constexpr,
                         PB: tl.constexpr, ASM: tl.constexpr, MMA_FROM: tl.constexpr, CDT: tl.constexpr,
                         TC: tl.constexpr):
    """grid (min(E, P) expert slots, I / BN, split) -> act [P, I] (row = pair id). ``split`` is a runtime
    argument (not a constexpr): one compiled kernel serves every token count. TC: the K loop on the tensor cores
    (``_tc_k_loop`` over the 2 * BN interleaved gate / up rows), else gemv's FMA loops."""
    slot, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    e, used, pairs, count = _gemv_pairs(ids_ptr, P, first, num_local, slot, BM, EB, PB)
    if slot >= used:
        return
    valid = pairs >= 0
    a_off = tl.where(valid, (pairs // topk) * stride_xm, -1)                  # the pairs' token rows of x
    c = pid_n * BN + tl.arange(0, BN)
    cm = c < I
    g_rows, u_rows = (2 * c).to(tl.int64), (2 * c + 1).to(tl.int64)
    wg_rows = w_ptr + e * stride_we + g_rows * stride_wn
    wu_rows = w_ptr + e * stride_we + u_rows * stride_wn
    sg_rows = s_ptr + e * stride_se + g_rows * stride_sn
    su_rows = s_ptr + e * stride_se + u_rows * stride_sn
    k_len = tl.cdiv(tl.cdiv(K, BK), split) * BK
    k_lo = pid_k * k_len
    k_hi = tl.minimum(k_lo + k_len, K)
    r = pid_n * 2 * BN + tl.arange(0, 2 * BN)                                      # gate / up rows 2c, 2c + 1
    wr, sr = w_ptr + e * stride_we + r * stride_wn, s_ptr + e * stride_se + r * stride_sn
    # MMA_FROM 0 is a constexpr False on the left of `and`: the plain gemv kernel builds without the branch
    if TC or (MMA_FROM > 0 and count >= MMA_FROM):
        acc_g, acc_u = _tc_gate_up(x_ptr, a_off, wr, sr, r < 2 * I, k_lo, k_hi, BN, BM, BK, ASM, CDT)
    else:
        acc_g, acc_u = _gemv_k_loop(x_ptr, a_off, count, wg_rows, sg_rows, wu_rows, su_rows, cm, k_lo, k_hi, True,
                                    BM, BN, BK, ASM)
    rows = tl.where(valid, pairs, 0)
    m = valid[:, None] & cm[None, :]
    finish = split == 1
    if split > 1:  # partials [split, P, 2, I]; the slice that finishes this tile last adds them up
        base = part_ptr + ((pid_k * P + rows[:, None]) * 2) * I + c[None, :]
        tl.store(base, acc_g, mask=m)
        tl.store(base + I, acc_u, mask=m)
        tile = cnt_ptr + slot * tl.num_programs(1) + pid_n
        finish = last_arrival(tile, split)
        if finish:
            acc_g, acc_u = _gate_up_partials(part_ptr, rows, m, c, P, I, BM, BN, split)
            tl.store(tile, 0)
    if finish:  # one call site: Triton 3.6 fails to compile this store in two branches at some tile shapes
        # tc: act is the down kernel's MMA operand, stored as bf16 already times TC_X_SCALE
        _swiglu_store(acc_g, acc_u, b_ptr + e * stride_be, g_rows, u_rows, cm, valid, act_ptr, rows, c, I,
                      limit, alpha, TC_X_SCALE if TC else 1.0)


@triton.jit
def _gemv_down_kernel(act_ptr, ids_ptr, rw_ptr, w_ptr, s_ptr, b_ptr, part_ptr, out_ptr, cnt_ptr, N, P, first,
                      num_local, K, H, stride_we, stride_wn, stride_se, stride_sn, stride_be, split,
                      TOPK: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                      BK: tl.constexpr, EB: tl.constexpr, PB: tl.constexpr, TB: tl.constexpr, ASM: tl.constexpr,
                      MMA_FROM: tl.constexpr, CDT: tl.constexpr, TC: tl.constexpr):
    """grid (min(E, P) expert slots, H / BN, split) -> out [N, H]: float32 partials [split, P, H] per pair; the
    program that completes a feature tile (all slots x slices) sums the k pairs of every token into out. TC: the K
    loop on the tensor cores (``_tc_k_loop``), else gemv's FMA loops."""
    slot, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    e, used, pairs, count = _gemv_pairs(ids_ptr, P, first, num_local, slot, BM, EB, PB)
    n = pid_n * BN + tl.arange(0, BN)
    nm = n < H
    if slot < used:
        valid = pairs >= 0
        a_off = tl.where(valid, pairs * K, -1)                                  # act rows = pair ids
        w_rows = w_ptr + e * stride_we + n.to(tl.int64) * stride_wn
        s_rows = s_ptr + e * stride_se + n.to(tl.int64) * stride_sn
        k_len = tl.cdiv(tl.cdiv(K, BK), split) * BK
        k_lo = pid_k * k_len
        k_hi = tl.minimum(k_lo + k_len, K)
        if TC or (MMA_FROM > 0 and count >= MMA_FROM):   # the hybrid's act is gemv's: float32, not yet scaled
            acc = tl.trans(_tc_k_loop(act_ptr, a_off, w_rows, s_rows, nm, k_lo, k_hi, BN, BM, BK, ASM, CDT, TC))
        else:
            acc, _ = _gemv_k_loop(act_ptr, a_off, count, w_rows, s_rows, w_rows, s_rows, nm, k_lo, k_hi, False,
                                  BM, BN, BK, ASM)
        rows = tl.where(valid, pairs, 0)
        tl.store(part_ptr + (pid_k * P + rows[:, None]) * H + n[None, :], acc, mask=valid[:, None] & nm[None, :])
        if last_arrival(cnt_ptr + pid_n, used * split):
            _combine_tokens(part_ptr, ids_ptr, rw_ptr, b_ptr, out_ptr, 0, N, n, nm, H, P, first, num_local,
                            stride_be, TOPK, HAS_BIAS, TB, BN, split)
            tl.store(cnt_ptr + pid_n, 0)
    elif (slot == 0) & (used == 0):  # no pair of the call lives on this rank: its partial sum is 0
        t = tl.arange(0, TB)
        tl.store(out_ptr + t.to(tl.int64)[:, None] * H + n[None, :], tl.zeros([TB, BN], dtype=tl.float32).to(
            out_ptr.dtype.element_ty), mask=(t < N)[:, None] & nm[None, :])


def _mma_dtype(device: torch.device):
    """The MMA operand / activation type: bf16 on CUDA; float32 in Triton's CPU interpreter (numpy has no bf16)."""
    return tl.bfloat16 if device.type == "cuda" else tl.float32


def route(ids: torch.Tensor, first: int, num_local: int, block_m: int):
    """ids [N, k] global expert ids -> (sorted [max_blocks * BM] int32 pair ids / -1, block_expert [max_blocks]
    int32, num_blocks [1] int32). max_blocks depends on shapes only (a fixed grid for CUDA graphs)."""
    P = ids.numel()
    max_blocks = min(num_local, P) + triton.cdiv(P, block_m)
    sorted_ids = torch.empty(max_blocks * block_m, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(max_blocks, dtype=torch.int32, device=ids.device)
    num_blocks = torch.empty(1, dtype=torch.int32, device=ids.device)
    _route_kernel[(num_local,)](ids.reshape(-1), P, first, num_local, sorted_ids, block_expert, num_blocks,
                                BM=block_m, EB=pow2(max(num_local, 2)), CP=min(1024, pow2(max(P, 16))))
    return sorted_ids, block_expert, num_blocks, max_blocks


def gemv_gate_up_grid(E: int, k: int, P: int, I: int, H: int, t: TileConfig, sms: int) -> tuple[tuple, dict]:
    """The gemv gate_up launch for P (token, expert) pairs of top-k routing over E local experts: its grid
    (expert slots, I / BN, K split) and launch constants. EB and PB depend on the tile config alone (tokens <=
    block_m), so one compiled kernel serves every token count. bench/mxfp4_probe.py launches its twins with it."""
    slots, n_gu = min(E, P), triton.cdiv(I, t.block_n)     # slots: the distinct local experts a call can touch
    split = split_for(t, slots * n_gu, triton.cdiv(H, t.block_k), sms)
    return (slots, n_gu, split), dict(BM=t.block_m, BN=t.block_n, BK=t.block_k, EB=pow2(max(E, 2)),
                                      PB=pow2(max(t.block_m * k, 16)), num_warps=t.num_warps, num_stages=t.num_stages)


def gemv_gate_up(x, ids_flat, k, gu_blocks, gu_scales, gu_bias, first, limit, alpha, act, cnt, grid, launch,
                 mma_from: int = 0, tc: bool = False) -> None:
    """act [P, I] (row = pair id) = SwiGLU(x's pair rows @ gate_up) + bias, one launch of grid / launch
    (gemv_gate_up_grid); cnt: its tiles' arrival counters (slots x I / BN); mma_from: TileConfig.mma_from; tc:
    the tc variant (act then bf16, times TC_X_SCALE)."""
    (E, two_i, G, _), H, I, P = gu_blocks.shape, x.shape[1], act.shape[1], act.shape[0]
    part = torch.empty(grid[2], P, 2, I, dtype=torch.float32, device=x.device) if grid[2] > 1 else act
    gu_b = gu_blocks.view(E, two_i, G * 16)
    _gemv_gate_up_kernel[grid](
        x, ids_flat, gu_b, gu_scales, gu_bias, act, part, cnt, P, first, E, H, I, k, float(limit), float(alpha),
        x.stride(0), gu_b.stride(0), gu_b.stride(1), gu_scales.stride(0), gu_scales.stride(1), gu_bias.stride(0),
        grid[2], ASM=x.device.type == "cuda", MMA_FROM=mma_from, CDT=_mma_dtype(x.device), TC=tc, **launch)


def _gemv_experts(x, ids, weights, gu_blocks, gu_scales, gu_bias, dn_blocks, dn_scales, dn_bias, first, limit, alpha,
                  t: TileConfig) -> torch.Tensor:
    """The gemv variant: two kernels (gate_up + SwiGLU, down + k-sum), no route kernel, no separate reduction."""
    (N, k), (E, two_i, _, _), H = ids.shape, gu_blocks.shape, x.shape[1]
    I, P, dev, sms = two_i // 2, N * k, x.device, num_sms(x.device)
    if N > t.block_m:
        raise ValueError(f"gemv keeps each expert's pairs in one block, so tokens per call ({N}) must be <= block_m "
                         f"({t.block_m}); use a larger block_m or the mma variant (default_tiles does)")
    grid_gu, launch = gemv_gate_up_grid(E, k, P, I, H, t, sms)
    (slots, n_gu, _), EB, PB, TB = grid_gu, launch["EB"], launch["PB"], t.block_m
    ids_flat, rw = ids.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
    n_dn = triton.cdiv(H, t.block_n)
    split_dn = split_for(t, slots * n_dn, triton.cdiv(I, t.dn_block_k), sms)
    cnt = tile_counters(dev, slots * n_gu + n_dn)
    # gemv: float32, the down kernel's FMAs take it as it is (a bf16 act costs a conversion per value and token
    # there); tc: the MMA operand type, times TC_X_SCALE (stored so by the gate_up kernel)
    act = torch.empty(P, I, dtype=torch.float32 if t.variant == "gemv" or dev.type != "cuda" else torch.bfloat16,
                      device=dev)                                                           # row = pair id
    gemv_gate_up(x, ids_flat, k, gu_blocks, gu_scales, gu_bias, first, limit, alpha, act, cnt, grid_gu, launch,
                 t.mma_from, t.variant == "tc")
    dn_b = dn_blocks.view(E, H, -1)
    bias = dn_bias if dn_bias is not None else gu_bias  # a valid pointer; unread when HAS_BIAS is False
    part = torch.empty(split_dn, P, H, dtype=torch.float32, device=dev)
    out = torch.empty(N, H, dtype=x.dtype, device=dev)
    _gemv_down_kernel[(slots, n_dn, split_dn)](
        act, ids_flat, rw, dn_b, dn_scales, bias, part, out, cnt[slots * n_gu:], N, P, first, E, I, H,
        dn_b.stride(0), dn_b.stride(1), dn_scales.stride(0), dn_scales.stride(1), bias.stride(0), split_dn, TOPK=k,
        HAS_BIAS=dn_bias is not None, BM=t.block_m, BN=t.block_n, BK=t.dn_block_k, EB=EB, PB=PB, TB=TB,
        ASM=dev.type == "cuda", MMA_FROM=t.mma_from, CDT=_mma_dtype(dev), TC=t.variant == "tc", num_warps=t.num_warps,
        num_stages=t.num_stages)
    return out


def fused_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                  gu_blocks: torch.Tensor, gu_scales: torch.Tensor, gu_bias: torch.Tensor,
                  dn_blocks: torch.Tensor, dn_scales: torch.Tensor, dn_bias: torch.Tensor | None,
                  first: int, num_experts: int, limit: float, alpha: float,
                  tiles: TileConfig | None = None, invariant: bool = False) -> torch.Tensor:
    """x [N, H]; ids, weights [N, k] (global expert ids, routing weights) -> this rank's partial sum [N, H].

    gu_blocks [E, 2I, H/32, 16] / gu_scales [E, 2I, H/32] (rows gate0, up0, gate1, ...), gu_bias [E, 2I];
    dn_blocks [E, H, I/32, 16] / dn_scales [E, H, I/32], dn_bias [E, H] or None (added by another rank).
    Pairs routed to experts outside [first, first + E) contribute 0 (expert parallelism over ``num_experts``).
    ``invariant``: the batch-invariant mode's tiles (invariant_tiles) unless ``tiles`` names others."""
    N, k = ids.shape
    E, two_i, G, _ = gu_blocks.shape
    H, I = x.shape[1], two_i // 2
    # checked when it was made (TileConfig.__post_init__)
    t = tiles or (invariant_tiles(x.device.type == "cuda") if invariant else default_tiles(N, k, E))
    mode = VARIANTS.index(t.variant)
    cdt = _mma_dtype(x.device)
    act_dtype = torch.bfloat16 if x.device.type == "cuda" else torch.float32
    x = x.contiguous()
    if t.variant in ("gemv", "tc"):
        return _gemv_experts(x, ids, weights, gu_blocks, gu_scales, gu_bias, dn_blocks, dn_scales, dn_bias, first,
                             limit, alpha, t)
    sorted_ids, block_expert, num_blocks, max_blocks = route(ids, first, E, t.block_m)
    R, sms, dev = max_blocks * t.block_m, num_sms(x.device), x.device
    # programs that do work: at most one row block per chosen expert at decode sizes
    busy = min(max_blocks, min(E, N * k) + (N * k) // t.block_m)
    act = torch.empty(R, I, dtype=act_dtype, device=dev)
    gu_b, gu_s = gu_blocks.view(E, two_i, G * 16), gu_scales
    n_gu = triton.cdiv(I, t.block_n)
    split = split_for(t, busy * n_gu, triton.cdiv(H, t.block_k), sms)
    part = torch.empty(split, R, 2, I, dtype=torch.float32, device=dev) if split > 1 else act
    _gate_up_kernel[(max_blocks, n_gu, split)](
        x, gu_b, gu_s, gu_bias, sorted_ids, block_expert, num_blocks, act, part, H, I, R, k, float(limit),
        float(alpha), x.stride(0), gu_b.stride(0), gu_b.stride(1), gu_s.stride(0), gu_s.stride(1), gu_bias.stride(0),
        BM=t.block_m, BN=t.block_n, BK=t.block_k, MODE=mode, DOT_SCALED=t.dot_scaled, SPLIT=split, CDT=cdt,
        num_warps=t.num_warps, num_stages=t.num_stages)
    if split > 1:
        _swiglu_kernel[(max_blocks, n_gu)](part, gu_bias, sorted_ids, block_expert, num_blocks, act, I, R,
                                           float(limit), float(alpha), gu_bias.stride(0), BM=t.block_m, BN=t.block_n,
                                           SPLIT=split, num_warps=4)
    dn_b, dn_s = dn_blocks.view(E, H, -1), dn_scales
    bias = dn_bias if dn_bias is not None else gu_bias  # a valid pointer; unread when HAS_BIAS is False
    n_dn = triton.cdiv(H, t.block_n)
    split = split_for(t, busy * n_dn, triton.cdiv(I, t.dn_block_k), sms)
    if split > 1:
        y = torch.empty(split, N * k, H, dtype=torch.float32, device=dev)
    else:  # every pair's row is written only when no expert lives on another rank
        y = (torch.empty if E == num_experts else torch.zeros)(N * k, H, dtype=x.dtype, device=dev)
    _down_kernel[(max_blocks, n_dn, split)](
        act, dn_b, dn_s, bias, sorted_ids, block_expert, num_blocks, weights.reshape(-1).contiguous(), y, I, H, N * k,
        dn_b.stride(0), dn_b.stride(1), dn_s.stride(0), dn_s.stride(1), bias.stride(0),
        HAS_BIAS=dn_bias is not None, BM=t.block_m, BN=t.block_n, BK=t.dn_block_k, MODE=mode, DOT_SCALED=t.dot_scaled,
        SPLIT=split, CDT=cdt, num_warps=t.num_warps, num_stages=t.num_stages)
    if split == 1:
        return y.view(N, k, H).sum(1)
    out = torch.empty(N, H, dtype=x.dtype, device=dev)
    _combine_kernel[(triton.cdiv(N, 4), triton.cdiv(H, 256))](
        y, ids.reshape(-1), weights.reshape(-1).contiguous(), bias, out, N, H, N * k, first, E, bias.stride(0), TOPK=k,
        HAS_BIAS=dn_bias is not None, TB=4, BN=256, SPLIT=split, num_warps=4)
    return out
