# SPDX-License-Identifier: Apache-2.0
"""Anchors drawn per training sample, and each batch's loss weight, so N data-parallel ranks compute what one
process computes on the same global batch.

ModelOpt 0.47 draws the anchors of a whole batch with one ``torch.rand(batch, len)`` from the global RNG and
caps every row at ``min(num_anchors, longest row's count - 1)``: the anchors of a sample depend on which other
samples share its batch, its padding, and how many draws came before. Here sample ``g`` of the stream (see
``batches.py``) draws from its own generator seeded by ``(seed, g)``, over its own tokens only, and keeps
``min(num_anchors, its valid positions)`` anchors: the same anchors whichever rank holds it, however its slice
is padded, and on resume without any RNG state. Otherwise the rule is ModelOpt's (uniform over the response
positions, sorted, unused slots masked).

ModelOpt's loss is a weighted mean over the batch: ``sum(loss * w) / (sum(w) + 1e-6)``. A rank reports its
``sum(w) + 1e-6`` and the number of scored positions (``last_weights``), so the training step can weight each
rank's loss by its share and the summed gradients are the gradient of the global batch's mean (``loop.py``).
"""
from __future__ import annotations

import types

import torch

from ..errors import DFlashError
from .kd_loss import loss_weights

_KEYS, _WEIGHTS = "_dflash_sample_keys", "_dflash_last_weights"


def sample_key(seed: int, g: int) -> int:
    """The generator seed of stream sample ``g`` (a 64-bit value torch accepts)."""
    return (seed % (1 << 23)) << 40 | g % (1 << 40)


def install(model) -> None:
    """Swap the per-sample anchor draw and the weight bookkeeping into a ModelOpt DFlash model, in place."""
    if not hasattr(model, "_sample_anchor_positions") or not hasattr(model, "_compute_loss"):
        raise DFlashError("ModelOpt model", "has no _sample_anchor_positions / _compute_loss (a ModelOpt release "
                          "other than 0.47?)", "use nvidia-modelopt==0.47.0")
    if getattr(model, "dflash_loss_objective", "decay") != "decay":
        raise DFlashError("ModelOpt model", f"uses loss objective {model.dflash_loss_objective!r}",
                          "dflash-train sets 'decay' (the paper's eq. 4)")
    model.__dict__[_KEYS] = None
    model.__dict__[_WEIGHTS] = None
    fallback = model._sample_anchor_positions
    model._sample_anchor_positions = types.MethodType(
        lambda self, seq_len, loss_mask, device: _sample(self, seq_len, loss_mask, device, fallback), model)
    compute = model._compute_loss

    def compute_loss(self, logits, input_ids, anchor_positions, block_keep_mask, loss_mask, base_logits=None):
        self.__dict__[_WEIGHTS] = _weights(self, input_ids, anchor_positions, block_keep_mask, loss_mask)
        return compute(logits, input_ids, anchor_positions, block_keep_mask, loss_mask, base_logits)

    model._compute_loss = types.MethodType(compute_loss, model)


def set_samples(model, keys) -> None:
    """The generator seeds (``sample_key``) of the rows of the next forward, in row order."""
    model.__dict__[_KEYS] = None if keys is None else [int(k) for k in keys]


def last_weights(model) -> tuple[float, float]:
    """(sum of the loss weights + 1e-6, scored positions) of the last forward: ModelOpt's denominators."""
    got = model.__dict__.get(_WEIGHTS)
    if got is None:
        raise DFlashError("ModelOpt model", "reported no loss weights", "call anchors.install(model) first")
    return got


def _sample(model, seq_len: int, loss_mask: torch.Tensor, device, fallback):
    keys = model.__dict__.get(_KEYS)
    if keys is None:   # a forward outside the training loop: ModelOpt's own draw
        return fallback(seq_len, loss_mask, device)
    bsz = loss_mask.shape[0]
    if len(keys) != bsz:
        raise DFlashError("anchor keys", f"{len(keys)} for a batch of {bsz}", "set_samples before each forward")
    B = model.dflash_block_size
    max_anchor = max(seq_len - B, 0)
    valid = (loss_mask[:, : max_anchor + 1] > 0.5).cpu()
    counts = valid.sum(dim=1)
    num_anchors = getattr(model, "_num_anchors", 512)
    max_n = min(num_anchors, int(counts.max()))
    if max_n <= 0:
        return (torch.zeros(bsz, 1, dtype=torch.long, device=device),
                torch.zeros(bsz, 1, dtype=torch.bool, device=device))
    vals = torch.full(valid.shape, 2.0)
    for i, key in enumerate(keys):
        pos = valid[i].nonzero().flatten()
        if len(pos):   # values over the sample's own positions: independent of the padding
            n = int(pos[-1]) + 1
            vals[i, :n] = torch.rand(n, generator=torch.Generator().manual_seed(key))
    vals = torch.where(valid, vals, torch.tensor(2.0))
    order = vals.argsort(dim=1, stable=True)[:, :max_n]
    # a row with fewer valid positions than max_n drew some invalid ones: past every valid one after the sort
    order = torch.where(torch.gather(valid, 1, order), order, torch.tensor(seq_len + 1))
    anchors = order.sort(dim=1).values
    keep = torch.arange(max_n).unsqueeze(0) < counts.clamp(max=max_n).unsqueeze(1)
    anchors = torch.where(keep, anchors, torch.zeros((), dtype=torch.long))
    return anchors.to(device), keep.to(device)


@torch.no_grad()
def _weights(model, input_ids, anchor_positions, block_keep_mask, loss_mask) -> tuple[float, float]:
    """ModelOpt 0.47's weight mask of ``_compute_loss`` (decay objective), summed: the loss's denominator."""
    _, _, mask, weights = loss_weights(model, input_ids, anchor_positions, block_keep_mask, loss_mask)
    scored = float(mask.sum())
    total = float(weights.sum()) + 1e-6
    return (total if total > 1.0 else 0.0), scored   # ModelOpt scores nothing at <= 1 (its loss is 0 then)
