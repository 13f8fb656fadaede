# SPDX-License-Identifier: Apache-2.0
"""Target families of the torch runtime, chosen by the checkpoint's ``architectures`` (one file each).

Every target model has the interface the engine uses: ``kv_shape()``, ``embed(ids)``, ``logits(h)``,
``forward(ids, positions, cache, rows, kv_len) -> (h, features)`` and ``config.vocab_size``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...errors import DFlashError
from ...model_config import GPT_OSS_ARCHITECTURES, LLAMA_ARCHITECTURES, GptOssConfig, LlamaConfig, architecture
from ..kernels import TORCH, Kernels
from . import gpt_oss, llama


@dataclass(frozen=True)
class TargetFamily:
    config: type                # model_config class: .from_hf(config.json dict) -> frozen config
    model: type                 # nn.Module(config, tp, max_positions, capture_layers[, ep_size, moe_kernel], kernels=)
    moe: bool                   # takes ep_size (expert parallelism)
    # this rank's HF tensors -> module tensors (model, device, dtype); None = llama.fuse_checkpoint (q/k/v + gate/up fusion)
    to_module: Callable | None = None

    def build(self, cfg, tp, max_positions: int, capture: tuple[int, ...], ep_size: int = 1,
              moe_kernel: str = "dequant", kernels: Kernels = TORCH):
        if not self.moe:
            if ep_size != 1:
                raise DFlashError("ep_size", f"{ep_size}, but {cfg.architecture} is dense (no experts)", "use ep_size 1")
            return self.model(cfg, tp, max_positions, capture, kernels=kernels)
        return self.model(cfg, tp, max_positions, capture, ep_size, moe_kernel, kernels=kernels)


_LLAMA = TargetFamily(LlamaConfig, llama.LlamaTarget, moe=False)
_GPT_OSS = TargetFamily(GptOssConfig, gpt_oss.GptOssTarget, moe=True, to_module=gpt_oss.checkpoint_to_module)
TARGETS: dict[str, TargetFamily] = {**{a: _LLAMA for a in LLAMA_ARCHITECTURES},
                                    **{a: _GPT_OSS for a in GPT_OSS_ARCHITECTURES}}


def target_family(cfg: dict) -> TargetFamily:
    """The family of a target's config.json; a DFlashError for architectures the runtime does not have."""
    arch = architecture(cfg)
    if arch not in TARGETS:
        raise DFlashError("target architectures", f"{arch} is not supported by the torch runtime",
                          f"use one of {', '.join(TARGETS)}")
    return TARGETS[arch]

