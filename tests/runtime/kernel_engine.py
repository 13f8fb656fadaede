# SPDX-License-Identifier: Apache-2.0
"""An engine whose models run RuntimeConfig.attention_kernel (the CPU and GPU kernel tests share it)."""
from __future__ import annotations

from trtllm_dflash.config import RuntimeConfig
from trtllm_dflash.runtime import loader
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.runtime.models.llama import set_attention_kernel


def engine_with_kernel(target_dir, drafter_dir, cfg: RuntimeConfig) -> Engine:
    """Engine.from_dirs with cfg.attention_kernel applied to the models before the engine captures its CUDA graphs
    (whether or not the Engine applies the setting itself)."""
    m = loader.load_pair(target_dir, drafter_dir, cfg)
    for model in (m.target, m.drafter):
        if model is not None:
            set_attention_kernel(model, cfg.attention_kernel)
    return Engine(m.target, m.drafter, m.tokenizer, cfg, m.tp, m.eos_ids)
