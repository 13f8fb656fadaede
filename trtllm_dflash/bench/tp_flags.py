# SPDX-License-Identifier: Apache-2.0
"""The engine settings both tensor-parallel benchmarks (``bench/tp.py``, ``bench/gpt_oss_tp.py``) give every rank,
as flags with RuntimeConfig's names: one definition, so the two benchmarks cannot drift apart."""
from __future__ import annotations

import argparse

from trtllm_dflash.config import RuntimeConfig
from trtllm_dflash.runtime.allreduce import STRATEGIES
from trtllm_dflash.runtime.kernels import SETTINGS


def add_rank_engine_flags(p: argparse.ArgumentParser, engines: str) -> None:
    """``--kernels`` (old name ``--attention_kernel``) and ``--allreduce_strategy``; ``engines`` says whose
    engines they set, for the help text."""
    p.add_argument("--kernels", "--attention_kernel", choices=SETTINGS, default="auto",
                   help=f"RuntimeConfig.kernels of {engines} (auto: the Triton decode kernels on CUDA, as one GPU "
                        "runs them; the torch path on the CPU)")
    p.add_argument("--allreduce_strategy", choices=STRATEGIES, default=RuntimeConfig.allreduce_strategy,
                   help=f"RuntimeConfig.allreduce_strategy of {engines} (auto: the one-shot all-reduce over peer "
                        "memory for decode-sized messages where the GPUs map each other's memory, NCCL otherwise)")
