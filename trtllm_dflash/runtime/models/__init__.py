# SPDX-License-Identifier: Apache-2.0
"""Target families of the torch runtime, chosen by the checkpoint's ``architectures`` (one file each).

Every target model has the interface the engine uses: ``kv_shape()``, ``embed(ids)``, ``logits(h)``,
``forward(ids, positions, cache, rows, kv_len) -> (h, features)`` and ``config.vocab_size``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...errors import DFlashError
from ...model_config import GPT_OSS_ARCHITECTURES, LLAMA_ARCHITECTURES, GptOssConfig, LlamaConfig
from ..kernels import TORCH, Kernels
from . import gpt_oss, llama, mxfp4


@dataclass(frozen=True)
class TargetFamily:
    config: type                # model_config class: .from_hf(config.json dict) -> frozen config
    model: type                 # nn.Module(config, tp, max_positions, capture_layers[, ep_size, moe_kernel], kernels=)
    moe: bool                   # takes ep_size (expert parallelism) and an MXFP4 expert kernel
    # this rank's HF tensors -> module tensors, dequantised (raw, model, device, dtype, keep_fp8) -> dict;
    # keep_fp8 (fp8_gemm): FP8 linears stay FP8 where the family runs them (runtime/fp8.py)
    to_module: Callable
    # what the model needs once its weights are in place (model) -> None, or None: nothing
    after_load: Callable | None = None

    def build(self, cfg, tp, max_positions: int, capture: tuple[int, ...], *, device: torch.device,
              ep_size: int = 1, mxfp4_moe: str = "dequant", kernels: Kernels = TORCH):
        """The model on the current (meta) device. ``mxfp4_moe``: RuntimeConfig.mxfp4_moe, resolved for
        ``device`` (mxfp4.resolve_kernel) where the family has experts; dense families ignore it."""
        if not self.moe:
            if ep_size != 1:
                raise DFlashError("ep_size", f"{ep_size}, but {cfg.architecture} is dense (no experts)", "use ep_size 1")
            return self.model(cfg, tp, max_positions, capture, kernels=kernels)
        moe_kernel = mxfp4.resolve_kernel(mxfp4_moe, cfg.mxfp4, device)
        return self.model(cfg, tp, max_positions, capture, ep_size, moe_kernel, kernels=kernels)


_LLAMA = TargetFamily(LlamaConfig, llama.LlamaTarget, moe=False, to_module=llama.checkpoint_to_module)
_GPT_OSS = TargetFamily(GptOssConfig, gpt_oss.GptOssTarget, moe=True, to_module=gpt_oss.checkpoint_to_module,
                        after_load=gpt_oss.after_load)
TARGETS: dict[str, TargetFamily] = {**{a: _LLAMA for a in LLAMA_ARCHITECTURES},
                                    **{a: _GPT_OSS for a in GPT_OSS_ARCHITECTURES}}


def target_family(cfg: LlamaConfig | GptOssConfig) -> TargetFamily:
    """The family of a parsed target config (model_config.target_config); a DFlashError for architectures the
    runtime does not have."""
    arch = cfg.architecture
    if arch not in TARGETS:
        raise DFlashError("target architectures", f"{arch} is not supported by the torch runtime",
                          f"use one of {', '.join(TARGETS)}")
    return TARGETS[arch]

