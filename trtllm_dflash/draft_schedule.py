# SPDX-License-Identifier: Apache-2.0
"""The TensorRT-LLM ``draft_len_schedule`` dflash-build writes when the user gave none: the draft length our
adaptive policy (runtime/draft_policy.py) picks at each batch size, from the decode-step costs measured for
this GPU and target (``cost_tables.json``, shipped with the package) at an assumed per-position acceptance.

The costs are our torch runtime's, not TensorRT-LLM's: they say how verify cost grows with batch x draft length
on that GPU at that model's shapes, which is what the schedule trades against acceptance.

Never a draft length of 0 for DFlash (``MIN_DRAFT_LEN``), at any batch size up to max_batch_size. In the
TensorRT-LLM releases we support, a schedule that resolves to 0 (an explicit 0, or any batch size above the
largest key: ``tensorrt_llm/_torch/speculative/utils.py: get_draft_len_for_batch_size``) makes the executor turn
speculation off for that iteration (``tensorrt_llm/_torch/pyexecutor/py_executor.py``: "Check if draft_len=0 ->
immediately disable", ``use_spec_decode = False``), so the one-model DFlash worker does not run; but that worker
is what appends each step's accepted tokens' target features to the request's stored drafting context
(``tensorrt_llm/_torch/speculative/dflash.py: DFlashWorker``, "The context accumulates across steps - each step
adds newly accepted tokens' projected hidden states to a per-request buffer"). Tokens committed at draft length
0 never enter that context, and once the batch shrinks the drafter attends to positions never written: its
acceptance collapses for the rest of each request. NVIDIA/TensorRT-LLM PR #16888 (open) reports this and floors
one-model modes at 1 (``min_runtime_draft_len``); until a release has it, we never ask for 0.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .trtllm import draft_len_for_batch, schedule_from_lengths
from .runtime.draft_policy import AcceptanceStats, AdaptivePolicy, CostTable, best_block

TABLES = Path(__file__).resolve().parent / "cost_tables.json"
MIN_DRAFT_LEN = 1     # DFlash's stored context is only updated while it drafts: see the module docstring
ZERO_DRAFT_REASON = ("at draft length 0 TensorRT-LLM skips the DFlash worker, whose per-request drafting context "
                     "then misses those tokens and acceptance collapses (NVIDIA/TensorRT-LLM PR #16888)")


def zero_draft_batch_sizes(schedule: dict[int, int], max_batch_size: int) -> list[int]:
    """The batch sizes 1..max_batch_size at which TensorRT-LLM would draft 0 under ``schedule`` (read as it
    reads it: the value of the first key >= the batch size, 0 above the largest key)."""
    return [n for n in range(1, max_batch_size + 1) if draft_len_for_batch(schedule, n, max(schedule.values())) == 0]


@dataclass(frozen=True)
class Derived:
    schedule: dict[int, int] | None   # None: the full draft at every batch size (a schedule would change nothing)
    source: str           # where the costs came from, for the build summary and the manifest
    note: str | None      # what the schedule could not express, or None


def cost_table(gpu: str, target_source: str, path: Path = TABLES) -> tuple[CostTable, str] | None:
    """The measured table for this GPU profile and target (hub id), with its source; None if there is none."""
    entry = json.loads(path.read_text())["tables"].get(gpu, {}).get(target_source)
    if entry is None:
        return None
    return CostTable.from_json(entry["cost_table"]), f"{entry['source']} ({entry['gpu']})"


def draft_len_schedule(policy: AdaptivePolicy, max_batch_size: int) -> tuple[dict[int, int], bool]:
    """The policy at its current acceptance estimate as TensorRT-LLM's ``draft_len_schedule`` over batch sizes
    1..max_batch_size (trtllm.schedule_from_lengths: TensorRT-LLM's reading of it), and whether batch 1
    was raised to the full draft (TensorRT-LLM requires max_draft_len there). Floored at MIN_DRAFT_LEN, so the last
    run is keyed at max_batch_size and no batch size up to it falls into TensorRT-LLM's implicit 0 above the
    largest key."""
    lengths = [max(MIN_DRAFT_LEN, best_block(policy, n) - 1) for n in range(1, max_batch_size + 1)]
    return schedule_from_lengths(lengths, policy.block_size - 1)


def derive(gpu: str, target_source: str, *, max_draft_len: int, max_batch_size: int, acceptance_rate: float,
           path: Path = TABLES) -> Derived | None:
    """The schedule at ``acceptance_rate`` per draft position (each draft accepted with that probability given
    the previous one was), or None where no cost table was measured for this GPU and target."""
    found = cost_table(gpu, target_source, path)
    if found is None:
        return None
    table, where = found
    stats = AcceptanceStats(max_draft_len + 1, prior_rate=acceptance_rate, prior_weight=1e9)  # the prior alone
    policy = AdaptivePolicy(max_draft_len + 1, table, stats=stats)
    schedule, raised = draft_len_schedule(policy, max_batch_size)
    if not raised and set(schedule.values()) == {max_draft_len}:   # the full draft everywhere: no schedule needed
        schedule = None
    note = (f"the cost model drafts {max(MIN_DRAFT_LEN, best_block(policy, 1) - 1)} at batch 1; TensorRT-LLM "
            f"requires max_draft_len {max_draft_len} there" if raised else None)
    return Derived(schedule, f"cost table {where}, acceptance {acceptance_rate} per draft position "
                             f"({stats.expected_tokens(max_draft_len + 1):.2f} tokens per full step)", note)
