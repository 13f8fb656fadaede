# SPDX-License-Identifier: Apache-2.0
"""bench/mxfp4_probe.py's kernel, in a module of its own: imported after the caller has chosen Triton's interpreter or
the GPU (TRITON_INTERPRET is read when ``triton.jit`` wraps a function)."""
import triton
import triton.language as tl

from trtllm_dflash.runtime.mxfp4_moe import _gemv_decode, _gemv_load, _gemv_pairs, _scale_x2p14


@triton.jit
def probe_kernel(ids_ptr, w_ptr, s_ptr, out_ptr, P, num_local, K, I, stride_we, stride_wn, stride_se,
                 stride_sn, split, DECODE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 EB: tl.constexpr, PB: tl.constexpr, ASM: tl.constexpr):
    """_gemv_gate_up_kernel's grid, expert lookup and loads; the arithmetic replaced by a fold of the tiles:
    DECODE False: the xor of every int32 word and scale byte loaded (what the test checks against the experts'
    bytes); True: the float32 sum of every decoded value (each group's sum times its scale, as the kernel
    scales), stored as its bits."""
    slot, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    e, used, pairs, count = _gemv_pairs(ids_ptr, P, 0, num_local, slot, BM, EB, PB)
    if slot >= used:
        return
    c = pid_n * BN + tl.arange(0, BN)
    cm = c < I
    g_rows, u_rows = (2 * c).to(tl.int64), (2 * c + 1).to(tl.int64)
    wg_rows, wu_rows = w_ptr + e * stride_we + g_rows * stride_wn, w_ptr + e * stride_we + u_rows * stride_wn
    sg_rows, su_rows = s_ptr + e * stride_se + g_rows * stride_sn, s_ptr + e * stride_se + u_rows * stride_sn
    k_len = tl.cdiv(tl.cdiv(K, BK), split) * BK
    k_lo = pid_k * k_len
    k_hi = tl.minimum(k_lo + k_len, K)
    fold_i = tl.zeros([BK // 32, BN, 4], dtype=tl.int32)
    fold_s = tl.zeros([BK // 32, BN], dtype=tl.int32)
    fold_f = tl.zeros([BK // 32, BN], dtype=tl.float32)
    wg, sg = _gemv_load(wg_rows, sg_rows, cm, k_lo, k_hi, BK)
    wu, su = _gemv_load(wu_rows, su_rows, cm, k_lo, k_hi, BK)
    for k0 in range(k_lo, k_hi, BK):
        wg_next, sg_next = _gemv_load(wg_rows, sg_rows, cm, k0 + BK, k_hi, BK)
        wu_next, su_next = _gemv_load(wu_rows, su_rows, cm, k0 + BK, k_hi, BK)
        if DECODE:
            g = _gemv_decode(wg, ASM)
            u = _gemv_decode(wu, ASM)
            fold_f += tl.sum(g[0] + g[1] + g[2] + g[3] + g[4] + g[5] + g[6] + g[7], axis=2) * _scale_x2p14(
                sg.to(tl.int32))
            fold_f += tl.sum(u[0] + u[1] + u[2] + u[3] + u[4] + u[5] + u[6] + u[7], axis=2) * _scale_x2p14(
                su.to(tl.int32))
        else:
            fold_i ^= wg ^ wu
            fold_s ^= (sg ^ su).to(tl.int32)
        wg, sg, wu, su = wg_next, sg_next, wu_next, su_next
    r = (slot * tl.num_programs(1) + pid_n) * tl.num_programs(2) + pid_k
    if DECODE:
        tl.store(out_ptr + r, tl.sum(tl.sum(fold_f, axis=1), axis=0).to(tl.int32, bitcast=True))
    else:
        tl.store(out_ptr + r, tl.xor_sum(tl.xor_sum(tl.xor_sum(fold_i, axis=2), axis=1), axis=0) ^
                 tl.xor_sum(tl.xor_sum(fold_s, axis=1), axis=0))
