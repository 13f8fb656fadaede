# SPDX-License-Identifier: Apache-2.0
"""FP8 GEMMs for ModelOpt FP8 targets (``RuntimeConfig.fp8_gemm``): weights stay float8_e4m3fn, activations
are quantized per token on the fly, and ``torch._scaled_mm`` multiplies them on FP8 tensor cores (CUDA
compute capability >= 8.9).

Scales: ``weight_scale`` is float32 [out], one per weight row. A fused qkv / gate_up projection concatenates
weights that were each quantized with their own per-tensor scale; repeating each scalar over its rows keeps
them exact (no requantization). Activations get one scale per token (amax / 448), computed in the forward,
so ModelOpt's static ``input_scale`` is not used: a per-token scale never clips and needs no calibration.
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from ..errors import DFlashError
from . import quant
from .models.layers import _fused

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max   # 448
_ALIGN = 16                      # _scaled_mm needs in_features and out_features to be multiples of 16


def check_device(device: torch.device, dtype: torch.dtype) -> None:
    """The one-line refusal when ``fp8_gemm`` is set where torch has no FP8 GEMM for us."""
    fix = "leave fp8_gemm off (FP8 weights are then dequantised on load)"
    if device.type != "cuda":
        raise DFlashError("fp8_gemm", f"needs a CUDA GPU with compute capability >= 8.9 (Ada, Hopper), "
                          f"the runtime is on {device.type}", fix)
    cc = torch.cuda.get_device_capability(device)
    if cc < (8, 9):
        raise DFlashError("fp8_gemm", f"needs CUDA compute capability >= 8.9 (Ada, Hopper), "
                          f"{torch.cuda.get_device_name(device)} has {cc[0]}.{cc[1]}", fix)
    if dtype != torch.bfloat16:
        raise DFlashError("fp8_gemm", f"needs dtype bfloat16 (the per-token scaled FP8 GEMM writes bfloat16), "
                          f"got {str(dtype).removeprefix('torch.')}", "use dtype auto or bfloat16, or " + fix)


def effective(setting: bool | None, device: torch.device, dtype: torch.dtype) -> bool:
    """fp8_gemm as it applies here: None (auto) = on where the FP8 GEMM runs; True is checked, not downgraded."""
    if setting is None:
        return (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
                and dtype == torch.bfloat16)
    if setting:
        check_device(device, dtype)
    return setting


@_fused
def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (float8_e4m3fn [M, K], float32 [M, 1]) with x ~= xq * scale, one scale per row (token)."""
    xf = x.float()
    scale = xf.abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    # clamp: e4m3fn has no infinity, so a value that rounds past 448 would become NaN
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


class Fp8Linear(nn.Module):
    """``nn.Linear`` with an FP8 weight: y = (xq * x_scale) @ (weight * weight_scale[:, None]).T + bias."""

    fast_accum = False   # Hopper's faster, less precise FP8 accumulation; trtllm_dflash/bench/fp8_gemm.py times both

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        # [out, in] row-major, so weight.t() is the column-major operand _scaled_mm takes without a copy
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(out_features, dtype=torch.float32), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, x_scale = quantize_rows(x.reshape(-1, self.in_features))
        out = torch._scaled_mm(xq, self.weight.t(), scale_a=x_scale, scale_b=self.weight_scale[None],
                               bias=self.bias, out_dtype=x.dtype, use_fast_accum=self.fast_accum)
        return out.view(*x.shape[:-1], self.out_features)


def unsupported(in_features: int, out_features: int, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``_scaled_mm`` cannot run this layer, or None."""
    if in_features % _ALIGN or out_features % _ALIGN:
        return f"in or out features not a multiple of {_ALIGN}"
    if device.type == "cuda" and dtype != torch.bfloat16:
        return f"dtype {str(dtype).removeprefix('torch.')} (per-token scaled FP8 GEMMs write bfloat16 on CUDA)"
    return None


def convert(model: nn.Module, sd: dict[str, torch.Tensor], device, dtype, log: bool = True) -> int:
    """Swap every ``nn.Linear`` whose weight ``sd`` holds in FP8 (with its per-row ``weight_scale``) for an
    Fp8Linear, before the weights are assigned (the model is still on the meta device). A layer the FP8 GEMM
    cannot run has its weight dequantised in ``sd`` instead, and is named on stderr. Returns the FP8 count."""
    skipped: dict[str, list[str]] = {}
    n = 0
    for name, mod in list(model.named_modules()):
        w = sd.get(f"{name}.weight")
        if not isinstance(mod, nn.Linear) or w is None or w.dtype != FP8:
            continue
        why = unsupported(mod.in_features, mod.out_features, torch.device(device), dtype)
        if why is not None:
            sd[f"{name}.weight"] = quant.dequantize_fp8(w, sd.pop(f"{name}.weight_scale"), dtype)
            skipped.setdefault(why, []).append(name)
            continue
        parent, _, child = name.rpartition(".")
        with torch.device("meta"):
            layer = Fp8Linear(mod.in_features, mod.out_features, mod.bias is not None)
        setattr(model.get_submodule(parent), child, layer)
        n += 1
    if log:
        for why, names in skipped.items():
            print(f"[trtllm_dflash] note: fp8_gemm: {len(names)} FP8 linears run dequantised ({why}): "
                  f"{', '.join(names[:4])}{' ...' if len(names) > 4 else ''}", file=sys.stderr)
    return n
