# SPDX-License-Identifier: Apache-2.0
"""The target a training run works for: its local folder (from ``--target``). Shared by the stages (corpus,
regenerate, train, export) and ``trtllm_dflash/bench/acceptance.py``, so none of them imports the ``dflash-train`` command to
get it; its tokenizer comes from ``checkpoints.text.load_tokenizer`` (None for a folder without one)."""
from __future__ import annotations

from pathlib import Path

from ..errors import DFlashError


def resolve_target(name: str) -> Path:
    """smollm2-135m (the packaged SmolLM2, converted from its GGUF on first use) or an HF checkpoint folder."""
    if name == "smollm2-135m":
        from ..checkpoints.packaged import smollm2_target_dir
        return smollm2_target_dir()
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise DFlashError("--target", f"{name} is not an HF checkpoint folder", "pass a folder or smollm2-135m")
    return path.absolute()
