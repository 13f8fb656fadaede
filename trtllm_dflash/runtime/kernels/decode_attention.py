# SPDX-License-Identifier: Apache-2.0
"""Triton kernels for the attention of the Llama family, the drafter and gpt-oss on the decode path
(RuntimeConfig.kernels).

Two kernels replace what was, per layer, a compiled norm+RoPE chain, two ``index_put`` cache writes, a mask
and a cuDNN SDPA call (or two batched matmuls and a masked softmax):

  rope_cache_write   grid (tokens, q + 2 kv heads): one program per (token, head). q heads: optional
                     per-head RMSNorm (Qwen3 q_norm), RoPE, stored to a new [n, T, Hq, d] tensor; k heads:
                     k_norm + RoPE stored straight into the cache row at the token's position (and, for
                     prefill, to a [n, T, Hkv, d] copy); v heads: copied into the cache. No index_put, no
                     intermediate q/k tensors.
  attend             grid (n * Hkv, splits): one program per (request, KV head, slice of the cache). Its
                     G = Hq / Hkv query heads x T query rows form one tile, so each K/V row is read once per
                     KV head (GQA). Scores and the online softmax are float32; a key at cache position p is
                     visible to query row (i, t) iff lo[i, t] <= p <= hi[i, t] and p < kv_len. Each program
                     only walks the keys its rows can see, so a graph captured for a KV-length bucket costs
                     what the real context costs. With several splits (flash-decoding: long contexts at small
                     batch) each writes float32 partials and the split that finishes last merges them in a
                     fixed order (kernels/arrival.py): one kernel per layer, no combine pass.
                     The splits partition the keys from the tile's lowest ``lo`` on, so a sliding window
                     (lo = pos - window + 1) costs the window, not the context. gpt-oss: optional attention
                     sinks, one learned logit per q head (natural-log units, not scaled by 1/sqrt(d)) that
                     joins the softmax denominator only: out = sum_j p_j v_j, p = softmax([scores, sink])
                     without the sink column (transformers' eager_attention_forward for GptOss).

Both are CUDA-graph safe: no host syncs, grids fixed by the shapes and the (per graph) kv_len.
Under ``TRITON_INTERPRET=1`` (set before this module is imported) they run on CPU tensors, which the CPU
tests use; the runtime itself only calls them on CUDA tensors.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# MAX_QUERY_ROWS: G * T rows per KV head in one tile (DFlash verify of 16 with G = 4 is 64)
from . import MAX_QUERY_ROWS, num_sms, pow2
from .arrival import last_arrival, tile_counters


# ---- norm + RoPE + cache write ---------------------------------------------------------------------------

@triton.jit
def _norm_rope(src, w_ptr, cs, sn, eps, HALF: tl.constexpr, NORM: tl.constexpr):
    """One head [2 * HALF] at src -> (first half, second half) after optional RMSNorm and RoPE, float32."""
    d1 = tl.arange(0, HALF)
    d2 = d1 + HALF
    x1 = tl.load(src + d1).to(tl.float32)
    x2 = tl.load(src + d2).to(tl.float32)
    if NORM:
        inv = tl.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / (2 * HALF) + eps)
        x1 = x1 * inv * tl.load(w_ptr + d1).to(tl.float32)
        x2 = x2 * inv * tl.load(w_ptr + d2).to(tl.float32)
    y1 = x1 * tl.load(cs + d1).to(tl.float32) - x2 * tl.load(sn + d1).to(tl.float32)
    y2 = x2 * tl.load(cs + d2).to(tl.float32) + x1 * tl.load(sn + d2).to(tl.float32)
    return y1, y2


@triton.jit
def _store_halves(dst, y1, y2, HALF: tl.constexpr):
    d1 = tl.arange(0, HALF)
    tl.store(dst + d1, y1.to(dst.dtype.element_ty))
    tl.store(dst + HALF + d1, y2.to(dst.dtype.element_ty))


@triton.jit
def _rope_cache_write_kernel(
        q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, pos_ptr, row_ptr,
        q_out_ptr, k_out_ptr, ck_ptr, cv_ptr,
        T, Hq, Hkv, eps,
        s_qn, s_qt, s_qh, s_kn, s_kt, s_kh, s_vn, s_vt, s_vh,
        s_cn, s_ct, s_pn, s_pt, s_row,
        s_cb, s_ch, s_cs, s_vb, s_vh2, s_vs,
        HALF: tl.constexpr, Q_NORM: tl.constexpr, K_NORM: tl.constexpr, K_OUT: tl.constexpr):
    tok = tl.program_id(0)
    head = tl.program_id(1)      # [0, Hq) q heads, [Hq, Hq + Hkv) k heads, then v heads
    i = tok // T
    t = tok % T
    pos = tl.load(pos_ptr + i * s_pn + t * s_pt)
    row = tl.load(row_ptr + i * s_row)
    cs = cos_ptr + i * s_cn + t * s_ct
    sn = sin_ptr + i * s_cn + t * s_ct
    if head < Hq:
        y1, y2 = _norm_rope(q_ptr + i * s_qn + t * s_qt + head * s_qh, qw_ptr, cs, sn, eps, HALF, Q_NORM)
        _store_halves(q_out_ptr + (tok * Hq + head) * (2 * HALF), y1, y2, HALF)
    elif head < Hq + Hkv:
        kh = head - Hq
        y1, y2 = _norm_rope(k_ptr + i * s_kn + t * s_kt + kh * s_kh, kw_ptr, cs, sn, eps, HALF, K_NORM)
        _store_halves(ck_ptr + row * s_cb + kh * s_ch + pos * s_cs, y1, y2, HALF)
        if K_OUT:
            _store_halves(k_out_ptr + (tok * Hkv + kh) * (2 * HALF), y1, y2, HALF)
    else:
        vh = head - Hq - Hkv
        d = tl.arange(0, 2 * HALF)
        x = tl.load(v_ptr + i * s_vn + t * s_vt + vh * s_vh + d)
        tl.store(cv_ptr + row * s_vb + vh * s_vh2 + pos * s_vs + d, x.to(cv_ptr.dtype.element_ty))


def rope_cache_write(q, k, v, cos, sin, q_w, k_w, eps: float, cache_k: torch.Tensor, cache_v: torch.Tensor,
                     rows: torch.Tensor, positions: torch.Tensor, want_k: bool):
    """q [n, T, Hq, d] or None, k/v [n, T, Hkv, d] (views of the qkv GEMM's output are fine: the last dim must
    be contiguous), cos/sin [n, T, 1, d], q_w/k_w [d] or None, cache_k/cache_v [max_batch, Hkv, S, d] (one
    layer), rows [n] (int), positions [n, T] -> (q roped [n, T, Hq, d] or None, k roped [n, T, Hkv, d] if
    ``want_k`` else None). k (roped) and v land in cache rows ``rows`` at ``positions``."""
    n, T, Hkv, d = k.shape
    if d % 2 or (d // 2) & (d // 2 - 1):
        raise ValueError(f"head_dim {d}: the fused RoPE kernel needs head_dim / 2 to be a power of two")
    if cos.stride() != sin.stride():
        raise ValueError("cos and sin must have the same strides")
    for name, x in (("q", q), ("k", k), ("v", v), ("cos", cos)):
        if x is not None and x.stride(-1) != 1:
            raise ValueError(f"{name}: the last dim must be contiguous")
    Hq = q.shape[2] if q is not None else 0
    q_out = torch.empty(n, T, Hq, d, dtype=q.dtype, device=q.device) if q is not None else None
    k_out = torch.empty(n, T, Hkv, d, dtype=k.dtype, device=k.device) if want_k else None
    if n * T == 0:
        return q_out, k_out
    dummy = k  # never read: the constexpr flags switch the corresponding loads and stores off
    qq = q if q is not None else dummy
    _rope_cache_write_kernel[(n * T, Hq + 2 * Hkv)](
        qq, k, v, cos, sin, q_w if q_w is not None else dummy, k_w if k_w is not None else dummy,
        positions, rows, q_out if q_out is not None else dummy, k_out if k_out is not None else dummy,
        cache_k, cache_v, T, Hq, Hkv, float(eps),
        qq.stride(0), qq.stride(1), qq.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        cos.stride(0), cos.stride(1), positions.stride(0), positions.stride(1), rows.stride(0),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), cache_v.stride(0), cache_v.stride(1),
        cache_v.stride(2),
        HALF=d // 2, Q_NORM=q_w is not None, K_NORM=k_w is not None, K_OUT=want_k,
        num_warps=1)
    return q_out, k_out


# ---- attention of short query blocks against the cache -------------------------------------------------

@triton.jit
def _attend_keys(q, k_base, v_base, lo, hi, begin, end, scale_log2, s_ks, s_vs, dd,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, IEEE: tl.constexpr):
    """The online softmax of the tile's rows over keys [begin, end), from an empty state -> (max, sum, acc) in log2
    units. A key tile past a row's last visible key leaves its state exactly as it was (alpha = 1, p = 0), so the
    keys other rows of the tile add never change a row's bits."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(begin, end, BLOCK_N):
        p = start + tl.arange(0, BLOCK_N)
        p_ok = p < end
        kt = tl.load(k_base + p[None, :] * s_ks + dd[:, None], mask=p_ok[None, :], other=0.0)   # [D, BLOCK_N]
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = s * scale_log2
        vis = (p[None, :] >= lo[:, None]) & (p[None, :] <= hi[:, None]) & p_ok[None, :]
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # rows that have seen nothing yet stay at 0
        alpha = tl.exp2(m_i - m_safe)
        pr = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(pr, 1)
        vt = tl.load(v_base + p[:, None] * s_vs + dd[None, :], mask=p_ok[:, None], other=0.0)    # [BLOCK_N, D]
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(pr.to(vt.dtype), vt, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(pr.to(vt.dtype), vt)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _merge_state(M, L, A, m, l, acc):
    """The running state (M, L, A) followed by a chunk's state (m, l, acc): the batch-invariant merge, one chunk at a
    time in key order. A row's first non-empty chunk comes through exactly (the running weight is 0, the chunk's
    1) and an empty chunk (m = -inf, l = 0, acc = 0) changes nothing, so the result depends on the row's own keys
    and the fixed chunk boundaries only."""
    M_new = tl.maximum(M, m)
    safe = tl.where(M_new == float("-inf"), 0.0, M_new)
    a = tl.exp2(M - safe)
    b = tl.exp2(m - safe)
    return M_new, L * a + l * b, A * a[:, None] + acc * b[:, None]


@triton.jit
def _attend_kernel(
        q_ptr, ck_ptr, cv_ptr, row_ptr, lo_ptr, hi_ptr, sink_ptr, out_ptr, part_ptr, ml_ptr, cnt_ptr,
        T, Hkv, kv_len, keys_per_split, scale_log2, s_row,
        s_qn, s_qt, s_qh, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ln, s_lt, s_hn, s_ht,
        G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        SPLITS: tl.constexpr, IEEE: tl.constexpr, SINK: tl.constexpr, INVARIANT: tl.constexpr = False,
        KEY_CHUNK: tl.constexpr = 256):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    mt = tl.program_id(2)               # query tile (batch-invariant mode: BLOCK_M rows of the G * T at a time)
    tiles = tl.num_programs(2)
    i = pid // Hkv
    kvh = pid % Hkv
    mr = tl.arange(0, BLOCK_M)
    m = mt * BLOCK_M + mr               # tile row m = t * G + g: query head kvh * G + g at block offset t
    t = m // G
    h = kvh * G + m % G
    m_ok = m < T * G
    dd = tl.arange(0, D)
    q = tl.load(q_ptr + i * s_qn + t[:, None] * s_qt + h[:, None] * s_qh + dd[None, :], mask=m_ok[:, None], other=0.0)
    lo = tl.load(lo_ptr + i * s_ln + t * s_lt, mask=m_ok, other=2147483647)
    hi = tl.load(hi_ptr + i * s_hn + t * s_ht, mask=m_ok, other=-1)
    hi = tl.minimum(hi, kv_len - 1)
    row = tl.load(row_ptr + i * s_row)
    k_base = ck_ptr + row * s_kb + kvh * s_kh
    v_base = cv_ptr + row * s_vb + kvh * s_vh
    last = tl.max(hi, 0) + 1
    tile = pid * tiles + mt             # this (request, KV head, query tile)'s partials and counter
    if INVARIANT:
        # keys in chunks of KEY_CHUNK at fixed absolute positions, each from an empty state, merged in key order
        # (_merge_state): the same chunks and the same merge whether one program walks them all (SPLITS = 1: prefill,
        # large batches) or each chunk has its own program (SPLITS > 1: few rows, long context)
        first = (tl.maximum(tl.min(lo, 0), 0) // KEY_CHUNK) * KEY_CHUNK
        if SPLITS == 1:
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, D], tl.float32)
            for c0 in range(first, last, KEY_CHUNK):
                mc, lc, ac = _attend_keys(q, k_base, v_base, lo, hi, c0, tl.minimum(c0 + KEY_CHUNK, last), scale_log2,
                                          s_ks, s_vs, dd, BLOCK_M, BLOCK_N, D, IEEE)
                m_i, l_i, acc = _merge_state(m_i, l_i, acc, mc, lc, ac)
        else:
            begin = first + split * KEY_CHUNK
            m_i, l_i, acc = _attend_keys(q, k_base, v_base, lo, hi, begin, tl.minimum(begin + KEY_CHUNK, last),
                                         scale_log2, s_ks, s_vs, dd, BLOCK_M, BLOCK_N, D, IEEE)
    else:
        # this program's keys: the splits partition [first, last visible key] from the tile's lowest lo (0 for causal
        # layers; pos - window + 1 for sliding ones), so keys below every row's lo are never walked. The last split
        # runs to the last visible key whatever keys_per_split says, so coverage never rests on the host's estimate.
        first = (tl.maximum(tl.min(lo, 0), 0) // BLOCK_N) * BLOCK_N
        begin = first + split * keys_per_split
        end = tl.where(split == SPLITS - 1, last, tl.minimum(begin + keys_per_split, last))
        m_i, l_i, acc = _attend_keys(q, k_base, v_base, lo, hi, begin, end, scale_log2, s_ks, s_vs, dd,
                                     BLOCK_M, BLOCK_N, D, IEEE)
    finish = True
    if SPLITS > 1:
        # float32 partials [tiles, splits, BLOCK_M, D] and (max, sum) [tiles, splits, 2, BLOCK_M]; the split
        # that completes the (request, KV head, query tile) merges them (kernels/arrival.py): no combine kernel
        base = tile * SPLITS + split
        tl.store(part_ptr + base * BLOCK_M * D + mr[:, None] * D + dd[None, :], acc)
        tl.store(ml_ptr + base * 2 * BLOCK_M + mr, m_i)
        tl.store(ml_ptr + base * 2 * BLOCK_M + BLOCK_M + mr, l_i)
        finish = last_arrival(cnt_ptr + tile, SPLITS)
        if finish:
            m_i, l_i, acc = _merge_splits(part_ptr, ml_ptr, tile, mr, dd, SPLITS, D, BLOCK_M, INVARIANT)
            tl.store(cnt_ptr + tile, 0)
    if finish:   # one store site (Triton 3.6 miscompiles a store repeated in two branches at some tile shapes)
        if SINK:   # the sink joins the denominator once, after the splits merged
            m_i, l_i, acc = _add_sink(sink_ptr, h, m_ok, m_i, l_i, acc)
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]   # a row that sees no key gives 0, not NaN
        # out [n, T, Hq * D]
        tl.store(out_ptr + ((i * T + t[:, None]) * (Hkv * G) + h[:, None]) * D + dd[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


@triton.jit
def _add_sink(sink_ptr, h, m_ok, m_i, l_i, acc):
    """Online-softmax state (max m_i and sum l_i in log2 units, acc = sum p v) of rows of q heads ``h`` -> the
    same state with each head's sink logit joined to the denominator (it has no value row)."""
    sink = tl.load(sink_ptr + h, mask=m_ok, other=0.0).to(tl.float32) * 1.4426950408889634   # ln -> log2 units
    m_new = tl.maximum(m_i, sink)                 # finite: a row that saw no key gets all its mass on the sink
    alpha = tl.exp2(m_i - m_new)
    return m_new, l_i * alpha + tl.exp2(sink - m_new), acc * alpha[:, None]


@triton.jit
def _merge_splits(part_ptr, ml_ptr, tile, m, dd, SPLITS: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                  INVARIANT: tl.constexpr):
    """The SPLITS partial states of ``tile`` -> one online-softmax state (max, sum, acc), merged in split order
    (deterministic): the batch-invariant mode one split at a time (_merge_state, as one program walking the same
    chunks does), else against the maximum over all splits. ``.cg`` loads: the other splits' partials were written
    by other SMs (L2, not this L1)."""
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    mx = tl.full([BLOCK_M], float("-inf"), tl.float32)
    if INVARIANT:
        for s in range(SPLITS):
            base = tile * SPLITS + s
            mx, l, acc = _merge_state(mx, l, acc, tl.load(ml_ptr + base * 2 * BLOCK_M + m, cache_modifier=".cg"),
                                      tl.load(ml_ptr + base * 2 * BLOCK_M + BLOCK_M + m, cache_modifier=".cg"),
                                      tl.load(part_ptr + base * BLOCK_M * D + m[:, None] * D + dd[None, :],
                                              cache_modifier=".cg"))
    else:
        for s in range(SPLITS):
            mx = tl.maximum(mx, tl.load(ml_ptr + (tile * SPLITS + s) * 2 * BLOCK_M + m, cache_modifier=".cg"))
        mx = tl.where(mx == float("-inf"), 0.0, mx)
        for s in range(SPLITS):   # fixed order: deterministic
            base = tile * SPLITS + s
            w = tl.exp2(tl.load(ml_ptr + base * 2 * BLOCK_M + m, cache_modifier=".cg") - mx)
            l += w * tl.load(ml_ptr + base * 2 * BLOCK_M + BLOCK_M + m, cache_modifier=".cg")
            acc += w[:, None] * tl.load(part_ptr + base * BLOCK_M * D + m[:, None] * D + dd[None, :],
                                        cache_modifier=".cg")
    return mx, l, acc


def num_splits(programs: int, kv_len: int, block_n: int, sms: int) -> int:
    """Splits of the cache per (request, KV head): enough programs to cover the GPU's SMs twice, none shorter
    than 4 key tiles (below that the merge costs more than the parallelism gains)."""
    want = max(1, -(-2 * sms // max(programs, 1)))
    return max(1, min(want, kv_len // (4 * block_n), 16))


# The batch-invariant mode's fixed launch (RuntimeConfig.batch_invariant): query rows per program and keys per chunk,
# the same for every number of query rows, requests and KV length. 64 rows: a DFlash verify of 16 with G = 4 (or
# an AR step of up to 64 heads per KV head) in one tile, the K/V read once per tile; 256 keys: the flash-decoding
# split that num_splits gave a batch-1 step at 512 keys of SmolLM2 (4 tiles of 64 keys).
INVARIANT_BLOCK_M = 64
KEY_CHUNK = 256


def attend(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, rows: torch.Tensor, kv_len: int,
           lo: torch.Tensor, hi: torch.Tensor, scale: float, splits: int | None = None,
           sinks: torch.Tensor | None = None, span: int | None = None,
           tiles: tuple[int, int] | None = None, invariant: bool = False) -> torch.Tensor:
    """q [n, T, Hq, d] (last dim contiguous), cache_k/cache_v [max_batch, Hkv, S, d] (one layer), rows [n],
    lo/hi [n, T] (visible key positions, inclusive) -> [n, T, Hq * d] in q's dtype. ``splits`` None picks
    by the device (num_splits). ``sinks`` [Hq] (gpt-oss): one logit per q head in the softmax denominator.
    ``span``: a bound on max(hi) - min(lo) + 1 over one request's rows (a sliding window: window + T - 1), used
    only to size the splits (None: kv_len); keys outside it are still attended, by the last split. ``tiles``
    (BLOCK_N, num_warps) overrides the defaults below (trtllm_dflash/bench/gpt_oss_kernels.py sweeps them).

    ``invariant`` (RuntimeConfig.batch_invariant): a row's bits depend on its own query, keys and key range only.
    Any T (prefill chunks too): the G * T rows of a (request, KV head) go in tiles of INVARIANT_BLOCK_M; keys in
    chunks of KEY_CHUNK at fixed positions, merged in key order; ``splits`` then only says whether the chunks
    share one program (1) or get one each (> 1; None: one each while the grid is smaller than twice the SMs)."""
    n, T, Hq, d = q.shape
    Hkv = cache_k.shape[1]
    G = Hq // Hkv
    if G * T > MAX_QUERY_ROWS and not invariant:
        raise ValueError(f"{G * T} query rows per KV head: the decode attention kernel takes at most {MAX_QUERY_ROWS}")
    if d & (d - 1) or d < 16:
        raise ValueError(f"head_dim {d}: the decode attention kernel needs a power of two >= 16")
    if sinks is not None and (sinks.shape != (Hq,) or sinks.stride(0) != 1):
        raise ValueError(f"sinks: expected a contiguous [{Hq}] tensor (one logit per q head), got {tuple(sinks.shape)}")
    if invariant:
        return _attend_invariant(q, cache_k, cache_v, rows, kv_len, lo, hi, scale, splits, sinks, span, tiles)
    BLOCK_M, BLOCK_N = max(16, pow2(G * T)), 64 if d <= 64 else 32
    num_warps = 4 if BLOCK_M * d <= 64 * 64 else 8
    if tiles is not None:
        BLOCK_N, num_warps = tiles
    # keys one program may walk: from its lowest lo rounded down to a tile (hence BLOCK_N - 1) to its highest hi
    cover = kv_len if span is None else max(1, min(kv_len, span + BLOCK_N - 1))
    if splits is None:
        splits = num_splits(n * Hkv, cover, BLOCK_N, num_sms(q.device))
    keys_per_split = -(-cover // splits)
    keys_per_split = -(-keys_per_split // BLOCK_N) * BLOCK_N
    splits = -(-cover // keys_per_split)
    out = torch.empty(n, T, Hq * d, dtype=q.dtype, device=q.device)
    if splits > 1:
        part = torch.empty(n * Hkv, splits, BLOCK_M, d, dtype=torch.float32, device=q.device)
        ml = torch.empty(n * Hkv, splits, 2, BLOCK_M, dtype=torch.float32, device=q.device)
    else:
        part = ml = out
    cnt = tile_counters(q.device, n * Hkv) if splits > 1 else rows   # rows: a valid pointer, never read
    LOG2E = 1.4426950408889634
    _attend_kernel[(n * Hkv, splits, 1)](
        q, cache_k, cache_v, rows, lo, hi, sinks if sinks is not None else lo, out, part, ml, cnt,
        T, Hkv, kv_len, keys_per_split, scale * LOG2E, rows.stride(0),
        q.stride(0), q.stride(1), q.stride(2), cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2), lo.stride(0), lo.stride(1), hi.stride(0), hi.stride(1),
        G=G, D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, SPLITS=splits, IEEE=q.dtype == torch.float32,
        SINK=sinks is not None, num_warps=num_warps)
    return out


def _attend_invariant(q, cache_k, cache_v, rows, kv_len, lo, hi, scale, splits, sinks, span, tiles) -> torch.Tensor:
    n, T, Hq, d = q.shape
    Hkv = cache_k.shape[1]
    G = Hq // Hkv
    BLOCK_M, BLOCK_N = INVARIANT_BLOCK_M, 64 if d <= 64 else 32
    num_warps = 4 if BLOCK_M * d <= 64 * 64 else 8
    if tiles is not None:
        BLOCK_N, num_warps = tiles
    if KEY_CHUNK % BLOCK_N:
        raise ValueError(f"BLOCK_N {BLOCK_N} must divide KEY_CHUNK {KEY_CHUNK}")
    q_tiles = -(-G * T // BLOCK_M)
    # chunks a tile may walk: from its lowest lo rounded down to a chunk to its highest hi
    cover = kv_len if span is None else max(1, min(kv_len, span + KEY_CHUNK - 1))
    chunks = -(-cover // KEY_CHUNK)
    programs = n * Hkv * q_tiles
    parallel = programs < 2 * num_sms(q.device) if splits is None else splits > 1
    splits = chunks if parallel and chunks > 1 else 1
    out = torch.empty(n, T, Hq * d, dtype=q.dtype, device=q.device)
    if splits > 1:
        part = torch.empty(programs, splits, BLOCK_M, d, dtype=torch.float32, device=q.device)
        ml = torch.empty(programs, splits, 2, BLOCK_M, dtype=torch.float32, device=q.device)
        cnt = tile_counters(q.device, programs)
    else:
        part = ml = out
        cnt = rows   # a valid pointer, never read
    LOG2E = 1.4426950408889634
    _attend_kernel[(n * Hkv, splits, q_tiles)](
        q, cache_k, cache_v, rows, lo, hi, sinks if sinks is not None else lo, out, part, ml, cnt,
        T, Hkv, kv_len, KEY_CHUNK, scale * LOG2E, rows.stride(0),
        q.stride(0), q.stride(1), q.stride(2), cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2), lo.stride(0), lo.stride(1), hi.stride(0), hi.stride(1),
        G=G, D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, SPLITS=splits, IEEE=q.dtype == torch.float32,
        SINK=sinks is not None, INVARIANT=True, KEY_CHUNK=KEY_CHUNK, num_warps=num_warps)
    return out
