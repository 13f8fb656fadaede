# SPDX-License-Identifier: Apache-2.0
"""Hand-written GPU kernels of the runtime (OpenAI Triton). Importing this package does not import Triton:
``Kernels.choose`` does, once, where RuntimeConfig.kernels asks for them."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from ...errors import DFlashError

# Query rows per KV head (G * T) up to which attention against the cache runs in the Triton kernel; larger
# blocks (chunked prefill) keep the torch path, whose flash kernel is built for them.
MAX_QUERY_ROWS = 128
# Rows (requests x block tokens) up to which the decode-path GEMMs run in the Triton GEMM (kernels/gemm.py);
# larger stay on cuBLAS. Measured on an H100 (dflash-bench gemm, benchmarks/results/gemm_bench_h100.json): up to
# 16 rows the Triton GEMMs match or beat cuBLAS at the 8B shapes (qkv 20.9 vs 21.3 us, o_proj 15.5 vs 16.7,
# down 40.5 vs 40.2, lm_head 406 vs 518, gate_up + SiLU 72.5 vs 78.2 for cuBLAS + silu_mul); at 64 rows cuBLAS
# is 4-10% faster for the plain projections (qkv 21.3 vs 22.2 us at the best Triton tile), while gate_up + SiLU
# stays ahead in Triton (77.8 vs 83.5 us). So: plain projections (qkv, o_proj, down, lm_head) up to
# GEMM_MAX_ROWS, the gated one up to GATED_GEMM_MAX_ROWS.
GEMM_MAX_ROWS = 16
GATED_GEMM_MAX_ROWS = 128
SETTINGS = ("auto", "triton", "torch")


@dataclass(frozen=True)
class Kernels:
    """Which kernels the decode path runs, chosen once (``choose``) and handed to every module when it is built:
    a module keeps the choice it was built with (no switch flips after construction, so CUDA graphs captured later
    hold exactly these kernels)."""

    triton: bool = False            # the Triton kernels of runtime/kernels/ for the models: q/k norm + RoPE + cache
    #                                 write, attention against the cache, the decode GEMMs and their epilogues,
    #                                 gpt-oss's router; False = the torch path (the reference; the only one on CPU)
    sampling: bool = False          # the step's sampling + acceptance + commit in kernels/sample.py (runner.py)
    # RuntimeConfig.batch_invariant where this device has a batch-invariant path: the Triton kernels' fixed launches
    # (every GEMM, attention and norm at every block size), or on the CPU in bfloat16 / float16 the torch path's
    # matmul attention for prefill too (its half-precision matmuls give a row the same bits whatever shares it;
    # float32 BLAS does not, so float32 on the CPU keeps SDPA); the torch path on CUDA (cuBLAS, SDPA) has none.
    batch_invariant: bool = False

    @classmethod
    def choose(cls, setting: str, batch_invariant: bool, device, dtype: torch.dtype) -> Kernels:
        """RuntimeConfig.kernels and .batch_invariant as they resolve for models on ``device`` in ``dtype``."""
        triton = resolve_setting(setting, torch.device(device))
        half_cpu = torch.device(device).type == "cpu" and dtype in (torch.bfloat16, torch.float16)
        return cls(triton=triton, sampling=triton, batch_invariant=bool(batch_invariant and (triton or half_cpu)))


TORCH = Kernels()


@functools.cache   # a device property query per kernel launch would be host work on the decode path
def pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1): block sizes and padded extents of the kernels' launches."""
    return 1 << (max(int(x), 1) - 1).bit_length()


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``, which size the kernels' grids; 4 off CUDA (the interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def resolve_setting(setting: str, device: torch.device) -> bool:
    """Whether RuntimeConfig.kernels runs the Triton kernels on ``device``: auto = on CUDA. "triton" off CUDA is an
    error, except under TRITON_INTERPRET=1 (the CPU tests run the kernels in Triton's interpreter)."""
    if setting not in SETTINGS:
        raise DFlashError("kernels", f"unknown value {setting!r}", f"use one of {', '.join(SETTINGS)}")
    kind = torch.device(device).type
    if setting == "torch" or (setting == "auto" and kind != "cuda"):
        return False
    if kind != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise DFlashError("kernels", f"'triton' runs on CUDA GPUs only, not on {kind}",
                          "use kernels='torch' (or 'auto') on this device")
    try:
        from . import decode_attention  # noqa: F401
    except Exception as err:  # a broken Triton install must be seen, not routed around
        raise DFlashError("kernels", f"{setting!r} needs OpenAI Triton, which failed to import ({err!r})",
                          "install triton (it ships with CUDA builds of torch) or set kernels='torch'")
    return True
