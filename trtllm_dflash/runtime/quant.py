# SPDX-License-Identifier: Apache-2.0
"""ModelOpt-quantized target weights (``export_hf_checkpoint`` layout): dequantised on load, or FP8 kept for fp8_gemm.

FP8 (``quant_algo: FP8``): ``<linear>.weight`` float8_e4m3fn [out, in] and ``weight_scale`` float32 (a scalar,
per tensor); value = weight * weight_scale.
NVFP4 (``quant_algo: NVFP4``): ``<linear>.weight`` uint8 [out, in / 2], two E2M1 codes per byte, low nibble
first; ``weight_scale`` float8_e4m3fn [out, in / 16], one scale per 16 inputs; ``weight_scale_2`` float32
scalar; value = E2M1[code] * weight_scale * weight_scale_2.
Both carry ``input_scale`` (static activation scales for TensorRT-LLM's FP8/FP4 GEMMs).

By default the torch runtime is weight-only: it multiplies the scales in once, per tensor-parallel slice, and
runs the model in its usual dtype, so the weights are exactly the quantized ones but activations are not
quantized and nothing is faster or smaller. With ``RuntimeConfig.fp8_gemm`` (CUDA, compute capability >= 8.9)
FP8 weights stay FP8 with one float32 scale per row, and runtime/fp8.py runs them as FP8 GEMMs on per-token
quantized activations. ``input_scale`` and KV-cache scales are consumed and unused either way.
"""
from __future__ import annotations

import sys

import torch

from ..errors import DFlashError

# The 16 E2M1 codes: sign bit 3, then exponent/mantissa bits (the same table as models/mxfp4.py).
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
NVFP4_GROUP = 16  # inputs per weight_scale entry
_UNUSED = (".input_scale", ".k_scale", ".v_scale")   # activation / KV-cache scales (TensorRT-LLM only)


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float8_e4m3fn [out, in] x weight_scale (scalar, or per output channel [out] / [out, 1]) -> ``dtype``."""
    if scale.dim() == 1:
        scale = scale[:, None]
    return (weight.float() * scale.float()).to(dtype)


def fp8_row_scales(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """An FP8 weight_scale (scalar, [out] or [out, 1]) as float32 [out]: one scale per weight row, so that
    weights fused along their rows (q/k/v, gate/up) carry their scales with them."""
    scale = scale.float()
    return scale.reshape(1).expand(rows).contiguous() if scale.numel() == 1 else scale.reshape(rows).contiguous()


def dequantize_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """uint8 [out, in / 2] + float8 [out, in / 16] + float32 scalar -> [out, in] in ``dtype``."""
    rows, half = packed.shape
    if block_scale.shape != (rows, half * 2 // NVFP4_GROUP):
        raise DFlashError("NVFP4 weight_scale", f"shape {tuple(block_scale.shape)} does not fit weight "
                          f"{tuple(packed.shape)} (one scale per {NVFP4_GROUP} inputs)",
                          "re-export the checkpoint with ModelOpt export_hf_checkpoint")
    lut = torch.tensor(E2M1, dtype=torch.float32, device=packed.device)
    # long indices: a uint8 index tensor would be read as a boolean mask
    codes = torch.stack([lut[(packed & 0x0F).long()], lut[(packed >> 4).long()]], dim=-1)   # [out, in / 2, 2]
    values = codes.view(rows, -1, NVFP4_GROUP) * block_scale.float()[..., None]          # [out, groups, 16]
    return (values.view(rows, -1) * global_scale.float()).to(dtype)


def dequantize(sd: dict[str, torch.Tensor], dtype: torch.dtype, keep_fp8: bool = False) -> dict[str, torch.Tensor]:
    """This rank's HF tensors with FP8 / NVFP4 linears replaced by ``dtype`` weights; every ``*_scale`` consumed.

    ``dtype`` is the runtime's, so the products are rounded once (float32 on CPU keeps them exact). A checkpoint
    without quantized weights is returned unchanged. ``keep_fp8`` (fp8_gemm) leaves FP8 weights as they are, each
    with its ``weight_scale`` as float32 [out] (fp8_row_scales).
    """
    quantized = [n for n, t in sd.items() if n.endswith(".weight") and f"{n}_scale" in sd]
    if not quantized:
        return sd
    out = dict(sd)
    for name in quantized:
        weight, scale = out.pop(name), out.pop(f"{name}_scale")
        if weight.dtype == torch.float8_e4m3fn and keep_fp8:
            out[name], out[f"{name}_scale"] = weight, fp8_row_scales(scale, weight.shape[0])
        elif weight.dtype == torch.float8_e4m3fn:
            out[name] = dequantize_fp8(weight, scale, dtype)
        elif weight.dtype == torch.uint8 and f"{name}_scale_2" in out:
            out[name] = dequantize_nvfp4(weight, scale, out.pop(f"{name}_scale_2"), dtype)
        else:
            raise DFlashError(f"tensor {name}", f"is {weight.dtype} with a weight_scale, which is neither ModelOpt FP8 "
                              "nor NVFP4", "quantize the target with dflash-build --quant fp8 or nvfp4")
    unsupported = sorted(n for n in out if n.endswith((".pre_quant_scale", ".weight_scale_2")))
    if unsupported:
        raise DFlashError(f"tensor {unsupported[0]}", "belongs to a ModelOpt format the torch runtime cannot "
                          "dequantise (AWQ / SmoothQuant)", "use --quant fp8 or nvfp4, or --backend trtllm")
    unused = [n for n in out if n.endswith(_UNUSED)]
    if any(n.endswith((".k_scale", ".v_scale")) for n in unused):
        print(f"[trtllm_dflash] note: the checkpoint quantizes the KV cache; the torch runtime keeps it in {dtype}",
              file=sys.stderr)
    for n in unused:
        del out[n]
    return out
