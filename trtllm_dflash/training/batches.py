# SPDX-License-Identifier: Apache-2.0
"""Regenerated rows -> padded training batches, in an order that depends only on (seed, step).

Sample ``g`` of the stream is row ``perm_e[g % N]`` of epoch ``e = g // N`` (a fresh seeded permutation per
epoch), and step ``s`` takes samples ``s*batch .. (s+1)*batch - 1``: a resumed run sees exactly the batches the
uninterrupted one would have. Each batch is right-padded to a multiple of the block size with ``B - 1`` spare
positions, because ModelOpt samples anchors only where a whole block fits (``anchor <= len - B``): the padding
lets every response token be an anchor, the last ones included.

Under N data-parallel ranks ``batch_size`` is the global batch: rank ``r`` takes its ``r``-th contiguous slice of
``batch_size / N`` samples of every step (padded to its own longest), so the N ranks together train on exactly
the samples, in the order, of one process at the same batch size. ``sample_ids`` names each row's stream sample
(``anchors.sample_key``): its anchors do not depend on the rank that holds it.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..errors import DFlashError
from .anchors import sample_key

IGNORE = -100  # label value ModelOpt (HF LabelSmoother) treats as "no loss here"


@dataclass(frozen=True)
class Example:
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]


def examples(rows: list[dict], max_seq_len: int) -> tuple[list[Example], dict]:
    """Rows cut to ``max_seq_len`` tokens; rows left with fewer than 2 response tokens are dropped (no block
    has a label). Returns the examples and counts for the report."""
    out, dropped, cut = [], 0, 0
    for r in rows:
        ids, mask = r["input_ids"][:max_seq_len], r["loss_mask"][:max_seq_len]
        cut += len(r["input_ids"]) > max_seq_len
        if sum(mask) < 2:
            dropped += 1
            continue
        out.append(Example(tuple(ids), tuple(mask)))
    if not out:
        raise DFlashError("training data", f"none of the {len(rows)} rows has 2+ response tokens within "
                          f"--max_seq_len {max_seq_len}", "raise --max_seq_len or --max_new_tokens")
    return out, {"examples": len(out), "dropped_short": dropped, "truncated": cut,
                 "supervised_tokens": sum(sum(e.loss_mask) for e in out)}


class BatchStream:
    def __init__(self, data: list[Example], batch_size: int, block_size: int, seed: int, pad_id: int = 0,
                 rank: int = 0, ranks: int = 1, pad_multiple: int | None = None):
        if batch_size % ranks:
            raise DFlashError("--batch_size", f"{batch_size} does not split over {ranks} ranks",
                              f"pass a multiple of {ranks} (the global batch: each rank takes an equal slice)")
        self.data, self.batch_size, self.block_size, self.seed, self.pad_id = data, batch_size, block_size, seed, pad_id
        self.rank, self.ranks = rank, ranks
        # padded lengths are multiples of this (a multiple of the block size): fewer distinct shapes per run
        self.pad_multiple = -(-(pad_multiple or block_size) // block_size) * block_size
        self._perms: dict[int, list[int]] = {}

    def _index(self, g: int) -> int:
        epoch, i = divmod(g, len(self.data))
        if epoch not in self._perms:
            self._perms = {epoch: random.Random(self.seed * 1_000_003 + epoch).sample(range(len(self.data)),
                                                                                     len(self.data))}
        return self._perms[epoch][i]

    def epoch_of(self, step: int) -> float:
        return step * self.batch_size / len(self.data)

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        """input_ids, attention_mask, labels [batch / ranks, L] and sample_ids [batch / ranks] of this rank's
        slice of optimizer step ``step`` (0-based)."""
        per = self.batch_size // self.ranks
        gs = [step * self.batch_size + self.rank * per + j for j in range(per)]
        items = [self.data[self._index(g)] for g in gs]
        B = self.block_size
        M = self.pad_multiple
        L = -(-(max(len(e.input_ids) for e in items) + B - 1) // M) * M
        ids = torch.full((len(items), L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(items), L), dtype=torch.long)
        labels = torch.full((len(items), L), IGNORE, dtype=torch.long)
        for j, e in enumerate(items):
            n = len(e.input_ids)
            ids[j, :n] = torch.tensor(e.input_ids)
            attn[j, :n] = 1
            labels[j, :n] = torch.where(torch.tensor(e.loss_mask, dtype=torch.bool), ids[j, :n], IGNORE)
        return {"input_ids": ids, "attention_mask": attn, "labels": labels,
                "sample_ids": torch.tensor([sample_key(self.seed, g) for g in gs], dtype=torch.long)}
