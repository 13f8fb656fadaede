# SPDX-License-Identifier: Apache-2.0
"""Everything an Engine is built from, for one tensor-parallel rank: from a Deployment (``load``), or from a plain
target/drafter pair (``load_pair``). The pair's configs are read once and checked before any rank starts or any
weight is read; the models come from weights.py, the tokenizer and stop ids from the target's folder.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..checkpoints import hf, text, validate
from ..config import RuntimeConfig
from ..deployment import Deployment
from ..model_config import DrafterConfig, target_config
from . import fp8
from .distributed import TPGroup, init_tp, launcher_rank_and_size
from .kernels import Kernels
from .models.dflash import DFlashDrafter
from .weights import load_models


@dataclass
class Loaded:
    """Engine's constructor arguments, by name."""

    target: nn.Module
    drafter: DFlashDrafter | None
    tokenizer: object | None
    tp: TPGroup
    eos_ids: set[int]
    cfg: RuntimeConfig


def load(deployment: Deployment, overrides: dict) -> Loaded:
    """A torch deployment for this rank: its runtime config with ``overrides``, and this rank's presharded slices
    when the build wrote them."""
    deployment.require_backend("torch", "the torch runtime",
                               "serve it with TensorRT-LLM (trtllm-serve) or rebuild with --backend torch")
    tp_size = deployment.tp_size
    rank_file = deployment.rank_file(launcher_rank_and_size()[0] if tp_size > 1 else 0)
    presharded = None
    if rank_file is not None:
        from safetensors.torch import load_file
        presharded = load_file(str(rank_file))
    return load_pair(deployment.target_dir, deployment.drafter_dir, deployment.runtime_config(overrides),
                     tp_size=tp_size, presharded=presharded, ep_size=deployment.ep_size)


def load_pair(target_dir, drafter_dir, cfg: RuntimeConfig, *, tp_size: int = 1, allow_pickle: bool = False,
              presharded: dict | None = None, ep_size: int = 1) -> Loaded:
    """Read the pair's configs, tokenizer and EOS ids, parse and check the configs (before any rank or weight is
    touched), join the tensor-parallel group, then load this rank's target and drafter (None for block_size 1).
    Each config.json is parsed here once; the parsed configs are what the checks and the models take."""
    device, dtype = resolve_device(cfg)
    target_dir = Path(target_dir)
    tcfg = hf.read_config(target_dir)
    dcfg = hf.read_config(drafter_dir) if drafter_dir is not None and cfg.block_size != 1 else None
    tokenizer = text.load_tokenizer(target_dir)   # with the configs: what the folders hold is read in one place
    eos_ids = text.eos_ids(target_dir, tcfg, tokenizer)
    drafter_cfg = DrafterConfig.from_hf(dcfg) if dcfg is not None else None
    if drafter_cfg is not None:
        validate.check_pair(tcfg, drafter_cfg, tp_size=tp_size, block_size=cfg.block_size)
    else:
        validate.check_tp(validate.head_counts(tcfg), tp_size, "target")
    target_cfg = target_config(tcfg)  # an architecture the runtime lacks fails here, before any rank starts
    tp = init_tp(tp_size, device, allreduce_strategy=cfg.allreduce_strategy)
    if device.type == "cuda" and tp.size > 1:
        device = torch.device("cuda", torch.cuda.current_device())
    kernels = Kernels.choose(cfg.kernels, cfg.batch_invariant, device, dtype)
    target, drafter = load_models(target_dir, target_cfg, drafter_dir, drafter_cfg, tp, device, dtype,
                                  cfg.max_seq_len, kernels=kernels, allow_pickle=allow_pickle, presharded=presharded,
                                  ep_size=ep_size, fp8_gemm=cfg.fp8_gemm, mxfp4_moe=cfg.mxfp4_moe)
    return Loaded(target, drafter, tokenizer, tp, eos_ids, cfg)


def resolve_device(cfg: RuntimeConfig) -> tuple[torch.device, torch.dtype]:
    """RuntimeConfig device/dtype ('auto' included) -> torch device and dtype."""
    dev = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                       "cpu" if cfg.device == "auto" else cfg.device)
    dtype = {"auto": torch.bfloat16 if dev.type == "cuda" else torch.float32, "float32": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}[cfg.dtype]
    if cfg.fp8_gemm:   # asked for explicitly: refuse off Hopper/Ada before loading (None = auto, in load_target)
        fp8.check_device(dev, dtype)
    return dev, dtype
