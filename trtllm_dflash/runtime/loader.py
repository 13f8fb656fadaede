# SPDX-License-Identifier: Apache-2.0
"""Build the target and drafter modules for one tensor-parallel rank and fill them from checkpoints.

Each rank reads only its slices (safetensors lazy slices), fuses q/k/v and gate/up, checks every tensor
is present with the expected shape, and never initialises weights it is about to overwrite (modules are
built on the meta device).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from ..checkpoints import hf
from ..errors import DFlashError
from . import fp8, quant
from .distributed import TPGroup
from .models import mxfp4, target_family
from .models.dflash import DFlashDrafter, DrafterConfig
from .models.layers import Rotary
from .shard import slice_for_rank

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _read(path: Path, tp: TPGroup, allow_pickle: bool, presharded: dict | None, prefix: str,
          ep_size: int = 1) -> dict:
    if presharded is not None:
        return {k[len(prefix):]: v for k, v in presharded.items() if k.startswith(prefix)}
    shapes = hf.tensor_names(path, allow_pickle=allow_pickle)
    sd = hf.load_state_dict(path, allow_pickle=allow_pickle,
                            slicer=lambda n, lazy: slice_for_rank(n, lazy, tp.size, tp.rank, shapes[n], ep_size))
    if tp.size > 1 and any(f.suffix != ".safetensors" for f in hf.weight_files(path, allow_pickle=True)):
        # pickle: sliced after loading
        sd = {n: slice_for_rank(n, t, tp.size, tp.rank, ep_size=ep_size) for n, t in sd.items()}
    return sd


def _fuse(raw: dict[str, torch.Tensor], prefix: str, num_layers: int) -> dict[str, torch.Tensor]:
    """HF names -> our names: q/k/v -> qkv_proj, gate/up -> gate_up_proj, ``prefix`` stripped.

    FP8 weights kept for fp8_gemm fuse the same way, their per-row ``weight_scale`` concatenated alongside."""
    out, used = {}, set()

    def take(name: str) -> torch.Tensor | None:
        used.add(name)
        return raw.get(name)

    for i in range(num_layers):
        src, dst = f"{prefix}layers.{i}.", f"layers.{i}."
        for kind in ("weight", "bias", "weight_scale"):
            qkv = [take(f"{src}self_attn.{p}_proj.{kind}") for p in "qkv"]
            if all(t is not None for t in qkv):
                out[f"{dst}self_attn.qkv_proj.{kind}"] = torch.cat(qkv)
            elif kind == "weight":
                missing = [f"{src}self_attn.{p}_proj.weight" for p, t in zip("qkv", qkv) if t is None]
                hf.missing_tensors([], missing, "checkpoint")
        gate, up = take(f"{src}mlp.gate_proj.weight"), take(f"{src}mlp.up_proj.weight")
        if gate is None or up is None:
            hf.missing_tensors([], [f"{src}mlp.gate_proj.weight" if gate is None else f"{src}mlp.up_proj.weight"], "checkpoint")
        out[f"{dst}mlp.gate_up_proj.weight"] = torch.cat([gate, up])
        scales = [take(f"{src}mlp.{p}_proj.weight_scale") for p in ("gate", "up")]
        if all(t is not None for t in scales):
            out[f"{dst}mlp.gate_up_proj.weight_scale"] = torch.cat(scales)
    for name, t in raw.items():
        if name in used or name.endswith(_IGNORED_SUFFIXES):
            continue
        key = name[len(prefix):] if name.startswith(prefix) else name
        out[key] = t
    return out


def _assign(module: nn.Module, sd: dict[str, torch.Tensor], where: str, device, dtype) -> None:
    """Replace the meta parameters by checkpoint tensors, checking names and shapes first."""
    expected = dict(module.named_parameters())
    hf.missing_tensors(sd.keys(), list(expected), where)
    extra = sorted(set(sd) - set(expected))
    if extra:
        raise DFlashError(f"{where}: tensor {extra[0]}", f"is not part of this architecture ({len(extra)} unexpected)",
                          "normalise the checkpoint with dflash-build (it converts known drafter formats)")
    for name, p in expected.items():
        if name in sd and tuple(sd[name].shape) != tuple(p.shape):
            raise DFlashError(f"{where}: tensor {name}", f"has shape {tuple(sd[name].shape)}, expected {tuple(p.shape)}",
                              "the checkpoint does not match its config.json (or the tp_size); re-export it")
    # FP8 weights and their float32 per-row scales (fp8_gemm), and packed MXFP4 experts (uint8) keep their
    # dtypes; everything else is cast.
    def cast(name: str, t: torch.Tensor) -> torch.Tensor:
        keep = t.dtype in (fp8.FP8, torch.uint8) or name.endswith(".weight_scale")
        return t.to(device=device, dtype=None if keep else dtype)

    module.load_state_dict({k: cast(k, v) for k, v in sd.items()}, strict=False, assign=True)


def load_target(path: Path, tp: TPGroup, device, dtype, max_positions: int, capture: tuple[int, ...] = (),
                allow_pickle: bool = False, presharded: dict | None = None, ep_size: int = 1,
                fp8_gemm: bool | None = False, mxfp4_moe: str = "dequant"):
    """The target model for this rank; its class comes from config.json ``architectures`` (models.TARGETS).

    ``fp8_gemm``: FP8 linears of Llama-family targets become fp8.Fp8Linear (None = where the device runs them).
    ``mxfp4_moe``: how MoE targets run MXFP4 experts (models/mxfp4.resolve_backend: auto, triton, dequant)."""
    hf_cfg = hf.read_config(path)
    family = target_family(hf_cfg)
    cfg = family.config.from_hf(hf_cfg)
    moe_backend = mxfp4.resolve_backend(mxfp4_moe, hf_cfg, torch.device(device)) if family.moe else "dequant"
    with torch.device("meta"):
        model = family.build(cfg, tp, max_positions, capture, ep_size, moe_backend)
    # ModelOpt FP8 / NVFP4 linears -> plain weights of this rank (runtime/quant.py); scales consumed. For fp8_gemm
    # FP8 weights stay FP8; families with their own tensor mapping (gpt-oss: MXFP4 experts) are always dequantised.
    asked = fp8_gemm
    if fp8_gemm is None:   # auto; an explicit True was checked against the device by the engine
        fp8_gemm = fp8.effective(None, torch.device(device), dtype)
    keep_fp8 = fp8_gemm and family.to_module is None
    raw = quant.dequantize(_read(path, tp, allow_pickle, presharded, "target.", ep_size), dtype, keep_fp8)
    sd = (family.to_module(raw, model, device, dtype) if family.to_module is not None
          else _fuse(raw, "model.", cfg.num_layers))
    if fp8_gemm:
        in_fp8 = fp8.convert(model, sd, device, dtype, log=tp.rank == 0)
        if in_fp8 == 0 and asked and tp.rank == 0:   # not an error: one setting serves quantized and plain targets
            print(f"[trtllm_dflash] note: fp8_gemm: target {path} has no FP8 linears to run in FP8; "
                  f"it runs in {str(dtype).removeprefix('torch.')}", file=sys.stderr)
    if "lm_head.weight" not in sd:
        if not cfg.tie_word_embeddings:
            hf.missing_tensors([], ["lm_head.weight"], f"target {path}")
        full = sd["embed_tokens.weight"]  # replicated, so slice this rank's vocab rows from it
        sd["lm_head.weight"] = slice_for_rank("lm_head.weight", full, tp.size, tp.rank)
    _assign(model, sd, f"target {path}", device, dtype)
    model.rotary = Rotary(cfg.rope, cfg.head_dim, max_positions, cfg.max_position_embeddings).to(device)
    return model.eval()


def load_drafter(path: Path, target_hidden: int, tp: TPGroup, device, dtype, max_positions: int,
                 allow_pickle: bool = False, presharded: dict | None = None) -> DFlashDrafter:
    cfg = DrafterConfig.from_hf(hf.read_config(path))
    with torch.device("meta"):
        model = DFlashDrafter(cfg, target_hidden, tp, max_positions)
    sd = _fuse(_read(path, tp, allow_pickle, presharded, "drafter."), "", cfg.num_layers)
    _assign(model, sd, f"drafter {path}", device, dtype)
    model.rotary = Rotary(cfg.rope, cfg.head_dim, max_positions, cfg.max_position_embeddings).to(device)
    return model.eval()
