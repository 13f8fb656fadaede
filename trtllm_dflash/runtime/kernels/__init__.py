# SPDX-License-Identifier: Apache-2.0
"""Hand-written GPU kernels of the runtime (OpenAI Triton). Importing this package does not import Triton:
``resolve_attention_kernel`` does, once, where RuntimeConfig.attention_kernel asks for the kernels."""
from __future__ import annotations

import functools
import os

import torch

from ...errors import DFlashError

# Query rows per KV head (G * T) up to which attention against the cache runs in the Triton kernel; larger
# blocks (chunked prefill) keep the torch path, whose flash kernel is built for them.
MAX_QUERY_ROWS = 128
# Rows (requests x block tokens) up to which the decode-path GEMMs run in the Triton GEMM (kernels/gemm.py);
# larger stay on cuBLAS. Measured on an H100 (benchmarks/gemm_bench.py, results/gemm_bench_h100.json): up to 16
# rows the Triton GEMMs match or beat cuBLAS at the 8B shapes (qkv 20.9 vs 21.3 us, o_proj 15.5 vs 16.7,
# down 40.5 vs 40.2, lm_head 406 vs 518, gate_up + SiLU 72.5 vs 78.2 for cuBLAS + silu_mul); at 64 rows cuBLAS
# is 4-10% faster for the plain projections (qkv 21.3 vs 22.2 us at the best Triton tile), while gate_up + SiLU
# stays ahead in Triton (77.8 vs 83.5 us). So: plain projections (qkv, o_proj, down, lm_head) up to
# GEMM_MAX_ROWS, the gated one up to GATED_GEMM_MAX_ROWS.
GEMM_MAX_ROWS = 16
GATED_GEMM_MAX_ROWS = 128
SETTINGS = ("auto", "triton", "torch")


class Kernel(str):
    """A resolved RuntimeConfig.attention_kernel ("triton" or "torch", equal to that string) that also carries
    RuntimeConfig.batch_invariant: every module with a ``kernel`` switch holds one (models/llama.set_attention_kernel),
    and the shared helpers of models/layers.py read ``batch_invariant`` from it, so call sites pass one value."""

    batch_invariant: bool

    def __new__(cls, name: str, batch_invariant: bool = False):
        k = super().__new__(cls, name)
        k.batch_invariant = bool(batch_invariant)
        return k


def batch_invariant(kernel: str) -> bool:
    """Whether ``kernel`` (a Kernel or a plain "triton" / "torch") asks for the batch-invariant path."""
    return getattr(kernel, "batch_invariant", False)


@functools.cache   # a device property query per kernel launch would be host work on the decode path
def pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1): block sizes and padded extents of the kernels' launches."""
    return 1 << (max(int(x), 1) - 1).bit_length()


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``, which size the kernels' grids; 4 off CUDA (the interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def resolve_attention_kernel(setting: str, device: torch.device) -> str:
    """RuntimeConfig.attention_kernel -> "triton" or "torch". auto = triton on CUDA, else torch. "triton" off
    CUDA is an error, except under TRITON_INTERPRET=1 (the CPU tests run the kernels in Triton's interpreter)."""
    if setting not in SETTINGS:
        raise DFlashError("attention_kernel", f"unknown value {setting!r}", f"use one of {', '.join(SETTINGS)}")
    kind = torch.device(device).type
    if setting == "torch" or (setting == "auto" and kind != "cuda"):
        return "torch"
    if kind != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise DFlashError("attention_kernel", f"'triton' runs on CUDA GPUs only, not on {kind}",
                          "use attention_kernel='torch' (or 'auto') on this device")
    try:
        from . import decode_attention  # noqa: F401
    except Exception as err:  # a broken Triton install must be seen, not routed around
        raise DFlashError("attention_kernel", f"{setting!r} needs OpenAI Triton, which failed to import ({err!r})",
                          "install triton (it ships with CUDA builds of torch) or set attention_kernel='torch'")
    return "triton"
