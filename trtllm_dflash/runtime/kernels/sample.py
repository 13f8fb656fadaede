# SPDX-License-Identifier: Apache-2.0
"""Triton kernels for the sampling + acceptance + commit of a decode step (RuntimeConfig.kernels).

They replace, per step, the torch chain of runtime/sampling.py (argmax; for sampled rows the counter-based
hash noise, two logs, a division, an add and an argmax; accept's eq/cumprod/sum) and sampling.commit
(where/gather/compare/copies): 90-96 small kernels for a sampled batch, 14-19 for a greedy one on the H100
(benchmarks/results/sample_bench_h100.json, torch_kernels), in two:

  _vocab_argmax   grid (n * T, splits): one program per (row, block position, slice of the vocab). Reads the
                  logits once and keeps the first maximal (value, index) of its slice: greedy rows take the
                  float32 logits, sampled rows (temperature > 0) the Gumbel-max score
                  logits.float() / temperature - log(-log(u)) with u = sampling.uniform_noise's value, computed
                  from the same 32-bit hash (bit for bit) in uint32 arithmetic. Several programs per position
                  (split-K style) so that one row of a 150k vocab still spreads over the GPU.
  _finish         grid (n,): per row, the first maximal index over the splits of each position (the target's
                  samples [T]), the accepted draft count (leading drafts equal to the samples), and, optionally,
                  the commit: start += a + 1, last = samples[a], active &= start <= limit (rows that are active).

Token identity with the torch path: the noise integers are identical; the float steps are the same IEEE ops in
the same order (a correctly rounded division, ``-log(-log(u))``, one add), with the device's float32 log in
both (torch's logf vs Triton's, each within an ulp). Ties go to the smallest index, as torch.argmax: a split
keeps its first maximum (strict > across its tiles, left tie-break inside one) and _finish takes the smallest
index among equal maxima. NaN logits are not handled (torch.argmax would pick the NaN).

Top-k / top-p rows are not handled here: ``handles(sb)`` says whether a batch may take these kernels, and the
runner routes the others to sampling.sample (the graph variants follow the same flags).

CUDA-graph safe: no host syncs; the grid and split plan depend on shapes only. Under ``TRITON_INTERPRET=1``
(set before this module is imported) they run on CPU tensors, which the CPU tests use.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import DFlashError
from ..sampling import Commit, SamplingBatch

# Defaults of the split plan (trtllm_dflash/bench/sample.py measures the alternatives on the GPU).
BLOCK_V = 1024     # vocab entries per tile of _vocab_argmax (a power of two)
PROGRAMS = 528     # programs _vocab_argmax aims for: 4 per SM of an H100 (132 SMs)
_NO_INDEX = tl.constexpr(2**31 - 1)   # "no index" in _finish: above any vocab id


def handles(sb: SamplingBatch) -> bool:
    """Whether these kernels sample the batch: greedy and plain temperature rows; top-k/top-p take the torch path."""
    return not (sb.any_top_k or sb.any_top_p)


def split_plan(positions: int, vocab: int, block_v: int = BLOCK_V, programs: int = PROGRAMS) -> tuple[int, int]:
    """(splits, vocab entries per split) for ``positions`` (rows x block) argmaxes over ``vocab``: enough splits
    that positions x splits reaches ``programs``, each a whole number of tiles, no split empty."""
    tiles = triton.cdiv(vocab, block_v)
    want = max(1, min(tiles, triton.cdiv(programs, positions)))
    per = triton.cdiv(tiles, want) * block_v
    return triton.cdiv(vocab, per), per


@triton.jit
def _mix32(x):
    # sampling._mix32 (murmur3 finaliser) on uint32: the products wrap mod 2**32 as the torch path's "& M32"
    x = x ^ (x >> 16)
    x = x * 0x045D9F3B
    x = x ^ (x >> 16)
    x = x * 0x045D9F3B
    return x ^ (x >> 16)


@triton.jit
def _vocab_argmax(logits_ptr, s_ln, s_lt, temp_ptr, seed_ptr, pos_ptr, s_pn, s_pt, val_ptr, idx_ptr,
                  T, V, PER_SPLIT, SPLITS, BLOCK_V: tl.constexpr, SAMPLED: tl.constexpr):
    rt = tl.program_id(0)          # row * T + block position
    split = tl.program_id(1)
    r, t = rt // T, rt % T
    base = logits_ptr + r.to(tl.int64) * s_ln + t.to(tl.int64) * s_lt
    lo = split * PER_SPLIT
    hi = tl.minimum(lo + PER_SPLIT, V)
    if SAMPLED:
        temp = tl.load(temp_ptr + r)
        seed = tl.load(seed_ptr + r)                                  # int64: both 32-bit halves count
        pos = tl.load(pos_ptr + r.to(tl.int64) * s_pn + t.to(tl.int64) * s_pt)
        s = seed.to(tl.uint32) ^ _mix32((seed >> 32).to(tl.uint32))
        h = _mix32(s ^ _mix32(pos.to(tl.uint32)))                     # the (seed, position) key of the noise
    best_v = tl.full((), float("-inf"), tl.float32)
    best_i = lo
    for off in range(lo, hi, BLOCK_V):
        cols = off + tl.arange(0, BLOCK_V)                            # [BLOCK_V] vocab ids
        mask = cols < hi
        x = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32)
        if SAMPLED:
            if temp > 0:
                bits = _mix32(h ^ _mix32((cols + 0x9E3779B).to(tl.uint32)))
                u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / (1 << 23))   # (0, 1), exact: sampling.uniform_noise
                x = tl.math.div_rn(x, temp) - tl.log(-tl.log(u))     # masked lanes stay -inf
        m, i = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
        better = m > best_v                                           # strict: an earlier tile keeps a tie
        best_i = tl.where(better, off + i, best_i)
        best_v = tl.where(better, m, best_v)
    tl.store(val_ptr + rt * SPLITS + split, best_v)
    tl.store(idx_ptr + rt * SPLITS + split, best_i)


@triton.jit
def _finish(val_ptr, idx_ptr, draft_ptr, s_dn, t_ptr, s_tn, a_ptr, start_ptr, last_ptr, active_ptr, limit,
            T, SPLITS, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, COMMIT: tl.constexpr):
    r = tl.program_id(0)
    ts = tl.arange(0, BLOCK_T)                                        # [BLOCK_T] block positions
    ss = tl.arange(0, BLOCK_S)                                        # [BLOCK_S] splits
    mask = (ts[:, None] < T) & (ss[None, :] < SPLITS)
    off = (r * T + ts)[:, None] * SPLITS + ss[None, :]
    v = tl.load(val_ptr + off, mask=mask, other=float("-inf"))        # [BLOCK_T, BLOCK_S]
    i = tl.load(idx_ptr + off, mask=mask, other=_NO_INDEX)
    best = tl.max(v, 1)
    tok = tl.min(tl.where(v == best[:, None], i, _NO_INDEX), 1)      # [BLOCK_T] first maximal index
    tl.store(t_ptr + r.to(tl.int64) * s_tn + ts, tok.to(tl.int64), mask=ts < T)
    # accepted drafts: the leading draft[j] == tok[j], j < T - 1 (T = 1: none, the load is fully masked)
    d = tl.load(draft_ptr + r.to(tl.int64) * s_dn + ts, mask=ts < T - 1, other=0)
    miss = (ts < T - 1) & (d != tok)
    a = tl.min(tl.where(miss, ts, T - 1), 0)
    tl.store(a_ptr + r, a.to(tl.int64))
    if COMMIT:
        bonus = tl.sum(tl.where(ts == a, tok, 0), 0).to(tl.int64)    # the target's sample after the accepted drafts
        act = tl.load(active_ptr + r) != 0
        start = tl.load(start_ptr + r)
        new_start = tl.where(act, start + a + 1, start)
        tl.store(last_ptr + r, tl.where(act, bonus, tl.load(last_ptr + r)))
        tl.store(start_ptr + r, new_start)
        tl.store(active_ptr + r, act & (new_start <= limit))


def sample_accept(logits: torch.Tensor, sb: SamplingBatch, positions: torch.Tensor, draft: torch.Tensor | None,
                  t_out: torch.Tensor, a_out: torch.Tensor, commit: Commit | None = None, *,
                  block_v: int = BLOCK_V, programs: int = PROGRAMS) -> None:
    """sampling.sample + sampling.accept (+ sampling.commit) in two kernels.

    logits [n, T, V] (last dim contiguous) predicting the tokens at positions [n, T]; draft [n, T-1] int64 or
    None (T = 1); writes the samples into t_out [n, T] int64 and the accepted counts into a_out [n] int64 (rows
    with a unit stride in their last dim, e.g. the runner's buffers sliced); ``commit``: the runner state
    advanced in place as sampling.commit does."""
    if not handles(sb):
        raise DFlashError("sampling", "the sampling kernels take greedy and temperature rows only",
                          "route top-k/top-p batches to sampling.sample (kernels.sample.handles)")
    n, T, V = logits.shape
    if logits.stride(2) != 1 or t_out.stride(1) != 1 or (draft is not None and draft.stride(1) != 1):
        raise DFlashError("sampling", "logits, t_out and draft need a contiguous last dim", "pass .contiguous()")
    if (draft is None) != (T == 1):
        raise DFlashError("sampling", f"a block of {T} verifies {T - 1} drafts", "pass draft [n, T-1] (None at T=1)")
    splits, per = split_plan(n * T, V, block_v, programs)
    vals = torch.empty(n * T, splits, dtype=torch.float32, device=logits.device)   # [n*T, splits] slice maxima
    idx = torch.empty(n * T, splits, dtype=torch.int32, device=logits.device)      # [n*T, splits] their ids
    _vocab_argmax[(n * T, splits)](
        logits, logits.stride(0), logits.stride(1), sb.temperature, sb.seed, positions,
        positions.stride(0), positions.stride(1), vals, idx, T, V, per, splits,
        BLOCK_V=block_v, SAMPLED=not sb.all_greedy, num_warps=4)
    d = draft if draft is not None else t_out                          # never read at T = 1
    c = commit or Commit(a_out, a_out, a_out, 0)                       # unused pointers without COMMIT
    _finish[(n,)](vals, idx, d, d.stride(0), t_out, t_out.stride(0), a_out, c.start, c.last, c.active, c.limit,
                  T, splits, BLOCK_T=triton.next_power_of_2(T), BLOCK_S=triton.next_power_of_2(splits),
                  COMMIT=commit is not None, num_warps=4)
