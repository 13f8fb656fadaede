# SPDX-License-Identifier: Apache-2.0
"""One model of one tensor-parallel rank, built on the meta device and filled from a checkpoint folder (or from
the slices a build wrote for the rank): the target (its class from config.json ``architectures``) and the DFlash
drafter.

Each rank reads only its slices (shard.rank_tensors), every tensor is checked for presence and shape before it
replaces a meta parameter, and no weight is initialised only to be overwritten.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from ..model_config import DrafterConfig, GptOssConfig, LlamaConfig
from . import fp8
from .distributed import TPGroup
from .kernels import TORCH, Kernels
from .models import llama, target_family
from .models.dflash import DFlashDrafter
from .models.layers import Rotary, assign_weights
from .shard import rank_tensors, tied_lm_head


def load_target(path: Path, cfg: LlamaConfig | GptOssConfig, tp: TPGroup, device, dtype, max_positions: int,
                capture: tuple[int, ...] = (), allow_pickle: bool = False, presharded: dict | None = None,
                ep_size: int = 1, fp8_gemm: bool | None = False, mxfp4_moe: str = "dequant",
                kernels: Kernels = TORCH):
    """The target model for this rank; its class comes from ``cfg.architecture`` (models.TARGETS).
    ``cfg``: the folder's config.json as parsed by whoever opened the folder (model_config.target_config), so one
    load parses it once. ``presharded``: this rank's tensors as the build wrote them (``target.<HF name>``), read
    instead of the checkpoint.

    ``fp8_gemm``: FP8 linears of Llama-family targets become fp8.Fp8Linear (None = where the device runs them).
    ``mxfp4_moe``: how MoE targets run MXFP4 experts (models/mxfp4.resolve_kernel: auto, triton, triton_kernels,
    dequant).
    ``kernels``: what its modules run (Kernels.choose)."""
    family = target_family(cfg)
    with torch.device("meta"):
        model = family.build(cfg, tp, max_positions, capture, device=torch.device(device), ep_size=ep_size,
                             mxfp4_moe=mxfp4_moe, kernels=kernels)
    raw = rank_tensors(path, tp.size, tp.rank, presharded=presharded, prefix="target.", allow_pickle=allow_pickle,
                       ep_size=ep_size, num_kv_heads=cfg.num_kv_heads)
    if cfg.tie_word_embeddings:
        raw.update(tied_lm_head(raw, tp.size, tp.rank))
    asked = fp8_gemm
    if fp8_gemm is None:   # auto; an explicit True was checked against the device by the engine
        fp8_gemm = fp8.effective(None, torch.device(device), dtype)
    # ModelOpt FP8 / NVFP4 linears -> plain weights of this rank (the family's to_module; runtime/quant.py). For
    # fp8_gemm FP8 weights stay FP8 where the family runs them (gpt-oss dequantises them).
    sd = family.to_module(raw, model, device, dtype, keep_fp8=fp8_gemm)
    if fp8_gemm:
        in_fp8 = fp8.convert(model, sd, device, dtype, log=tp.rank == 0)
        if in_fp8 == 0 and asked and tp.rank == 0:   # not an error: one setting serves quantized and plain targets
            print(f"[trtllm_dflash] note: fp8_gemm: target {path} has no FP8 linears to run in FP8; "
                  f"it runs in {str(dtype).removeprefix('torch.')}", file=sys.stderr)
    assign_weights(model, sd, f"target {path}", device, dtype)
    if family.after_load is not None:
        family.after_load(model)
    model.rotary = Rotary(cfg.rope, cfg.head_dim, max_positions, cfg.max_position_embeddings).to(device)
    return model.eval()


def load_models(target_dir: Path, target_cfg: LlamaConfig | GptOssConfig, drafter_dir: Path | None,
                drafter_cfg: DrafterConfig | None, tp: TPGroup, device, dtype, max_positions: int, *, kernels: Kernels,
                allow_pickle: bool = False, presharded: dict | None = None, ep_size: int = 1,
                fp8_gemm: bool | None = False, mxfp4_moe: str = "dequant"):
    """(target, drafter) of this rank, the drafter None without ``drafter_cfg``; the drafter first, since its
    target_layer_ids are the layers the target captures. ``kernels`` has no default: it must be Kernels.choose of the
    RuntimeConfig the engine will run (the Engine refuses models built with other kernels)."""
    drafter = (load_drafter(Path(drafter_dir), drafter_cfg, target_cfg.hidden_size, tp, device, dtype, max_positions,
                            allow_pickle, presharded, kernels=kernels) if drafter_cfg is not None else None)
    capture = drafter.config.target_layer_ids if drafter is not None else ()
    target = load_target(Path(target_dir), target_cfg, tp, device, dtype, max_positions, capture, allow_pickle,
                         presharded, ep_size, fp8_gemm=fp8_gemm, mxfp4_moe=mxfp4_moe, kernels=kernels)
    return target, drafter


def load_drafter(path: Path, cfg: DrafterConfig, target_hidden: int, tp: TPGroup, device, dtype, max_positions: int,
                 allow_pickle: bool = False, presharded: dict | None = None,
                 kernels: Kernels = TORCH) -> DFlashDrafter:
    """The DFlash drafter for this rank (``cfg``: DrafterConfig.from_hf of its config.json, parsed once by the
    caller; ``presharded``: as load_target, keys ``drafter.<name>``)."""
    raw = rank_tensors(path, tp.size, tp.rank, presharded=presharded, prefix="drafter.", allow_pickle=allow_pickle,
                       num_kv_heads=cfg.num_kv_heads)
    sd = llama.fuse_checkpoint(raw, "", cfg.num_layers)
    with torch.device("meta"):
        model = DFlashDrafter(cfg, target_hidden, tp, max_positions, kernels)
    assign_weights(model, sd, f"drafter {path}", device, dtype)
    model.rotary = Rotary(cfg.rope, cfg.head_dim, max_positions, cfg.max_position_embeddings).to(device)
    return model.eval()
