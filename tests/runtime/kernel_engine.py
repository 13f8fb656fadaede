# SPDX-License-Identifier: Apache-2.0
"""An engine whose models run RuntimeConfig.attention_kernel (the CPU and GPU kernel tests share it)."""
from __future__ import annotations

from trtllm_dflash.config import RuntimeConfig
from trtllm_dflash.runtime.engine import Engine


def engine_with_kernel(target_dir, drafter_dir, cfg: RuntimeConfig) -> Engine:
    """Engine.from_dirs: the Engine sets cfg.attention_kernel on both models before it captures its CUDA graphs."""
    return Engine.from_dirs(target_dir, drafter_dir, cfg)
