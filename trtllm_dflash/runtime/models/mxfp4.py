# SPDX-License-Identifier: Apache-2.0
"""MXFP4 expert weights, as gpt-oss checkpoints store them, dequantised on load.

Format (OCP microscaling FP4; transformers' ``integrations/mxfp4.py`` reads the same layout):
``<name>_blocks`` uint8 [..., rows, groups, 16] packs 32 FP4 (E2M1) values per group, two per byte, the
low nibble first; ``<name>_scales`` uint8 [..., rows, groups] is each group's power-of-two scale (E8M0,
biased by 127). value = E2M1[nibble] * 2 ** (scale - 127). Rows are output features and the groups run
along the input features, so the dequantised [..., rows, groups * 32] is transposed to the Hugging Face
parameter layout [..., in, out] (used as ``x @ W``).
"""
from __future__ import annotations

import torch

from ...errors import DFlashError

# The 16 E2M1 codes: sign bit 3, then exponent/mantissa bits.
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
GROUP = 32  # values per scale
# the largest E8M0 scale byte the Triton kernels decode (runtime/mxfp4_moe.py's tc variant keeps 2^(s - 65) in
# bf16): 2^65 per group, far above any trained weight's (gpt-oss's are ~2^-8); 255 is E8M0's NaN
MAX_SCALE = 192
KERNELS = ("auto", "triton", "triton_kernels", "dequant")


def resolve_kernel(setting: str, is_mxfp4: bool, device: torch.device) -> str:
    """RuntimeConfig.mxfp4_moe -> "triton" (experts kept MXFP4, fused kernels), "triton_kernels" (the same, with
    steps of 2+ tokens on the triton_kernels library: models/gpt_oss.TritonKernelsExperts) or "dequant" (bf16 on
    load).

    auto = "triton" for an MXFP4 checkpoint on CUDA, else "dequant"; an explicit "triton" / "triton_kernels" off
    CUDA or on a checkpoint without MXFP4 experts is an error, never a quiet switch to the other path. ``is_mxfp4``: the
    checkpoint's experts are MXFP4 (GptOssConfig.mxfp4)."""
    if setting not in KERNELS:
        raise DFlashError("mxfp4_moe", f"unknown value {setting!r}", f"use one of {', '.join(KERNELS)}")
    if setting == "auto":
        return "triton" if is_mxfp4 and device.type == "cuda" else "dequant"
    if setting != "dequant" and device.type != "cuda":
        raise DFlashError("mxfp4_moe", f"{setting!r} runs on CUDA GPUs only, not on {device.type}",
                          "use mxfp4_moe='dequant' (or 'auto') on this device")
    if setting != "dequant" and not is_mxfp4:
        raise DFlashError("mxfp4_moe", f"{setting!r} needs a checkpoint with MXFP4 experts (quantization_config."
                          "quant_method 'mxfp4'); this one has none", "use mxfp4_moe='dequant' (or 'auto')")
    return setting


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
               device: torch.device | str | None = None) -> torch.Tensor:
    """blocks [..., R, G, 16] uint8 + scales [..., R, G] uint8 -> [..., G * 32, R] in ``dtype`` on ``device``.

    Works one leading index (one expert) at a time, so the float32 temporaries stay at one expert's size
    (66 MB for a gpt-oss-120b gate_up expert) however many experts are dequantised.
    """
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise DFlashError("MXFP4 weights", f"blocks/scales are {blocks.dtype}/{scales.dtype}, expected uint8",
                          "pass the checkpoint's *_blocks and *_scales tensors unchanged")
    if blocks.dim() < 3 or blocks.shape[-1] != GROUP // 2 or blocks.shape[:-1] != scales.shape:
        raise DFlashError("MXFP4 weights", f"blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not "
                          f"pair up as [..., rows, groups, {GROUP // 2}] and [..., rows, groups]",
                          "the checkpoint is damaged or not MXFP4; re-download it")
    device = torch.device(device) if device is not None else blocks.device
    *lead, R, G, _ = blocks.shape
    out = torch.empty(*lead, G * GROUP, R, dtype=dtype, device=device)
    lut = torch.tensor(E2M1, dtype=torch.float32, device=device)
    flat_b, flat_s, flat_o = blocks.reshape(-1, R, G, GROUP // 2), scales.reshape(-1, R, G), out.view(-1, G * GROUP, R)
    for i in range(flat_b.shape[0]):
        b = flat_b[i].to(device)                                                     # [R, G, 16]
        # long indices: a uint8 index tensor would be read as a boolean mask
        vals = torch.stack([lut[(b & 0x0F).long()], lut[(b >> 4).long()]], dim=-1)   # [R, G, 16, 2], low nibble first
        vals = vals.view(R, G, GROUP) * torch.exp2(flat_s[i].to(device).float() - 127.0)[..., None]
        flat_o[i] = vals.view(R, G * GROUP).T.to(dtype)
    return out
