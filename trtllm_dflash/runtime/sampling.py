# SPDX-License-Identifier: Apache-2.0
"""Target sampling and DFlash acceptance.

Verification is sample-then-match: the target samples its own token at every block position, and a
draft token is accepted while it equals the target's sample at the position before it. With an argmax
(one-hot) draft this is exactly speculative sampling with q = delta(draft), hence lossless.

Sampling noise is a hash of (seed, absolute position, vocab id), not a stateful generator. So the token
drawn for position p of a request does not depend on how decoding was split into blocks or batched:
DFlash with a seed emits *the same tokens* as autoregressive decoding with that seed, which makes
losslessness testable token for token at any temperature (and the chi-square test checks the law).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # murmur3 finaliser on values < 2**32 held in int64; every product stays < 2**63 (no overflow)
    x = x ^ (x >> 16)
    x = (x * 0x045D9F3B) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x045D9F3B) & _M32
    return x ^ (x >> 16)


def seed_int64(seed: int) -> int:
    """A uint64 or int64 seed as the int64 with the same 64 bits (two's complement): 2**63 -> -2**63,
    2**64 - 1 -> -1. One-to-one, so distinct uint64 seeds stay distinct."""
    return seed - 2**64 if seed >= 2**63 else seed


def uniform_noise(seed: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """seed [n] int64, positions [n, T] -> u [n, T, vocab] in (0, 1), float32, deterministic on any device."""
    v = torch.arange(vocab, device=positions.device, dtype=torch.int64)
    # Both 32-bit halves of the seed count (mix32(0) = 0, so seeds < 2**32 keep their old streams).
    s = (seed & _M32) ^ _mix32((seed >> 32) & _M32)                 # [n]
    h = _mix32(s[:, None] ^ _mix32(positions & _M32))               # [n, T]
    return unit_interval(_mix32(h[..., None] ^ _mix32(v + 0x9E3779B)))   # [n, T, V]


def unit_interval(x: torch.Tensor) -> torch.Tensor:
    """32-bit hash values (int64 in [0, 2**32)) -> float32 in (0, 1), open at both ends."""
    # 23 bits, so (k + 0.5) is exact in float32 and u <= 1 - 2**-24 < 1. With 24 bits the top value
    # 2**24 - 0.5 rounded to 2**24 (u = 1.0, a Gumbel score of +inf: that token won whatever its logit), once
    # in 2**24 draws, ~1% of the positions at a 150k vocab (seen on the H100 as NaN in the float64 check).
    return ((x >> 9).float() + 0.5) * (1.0 / (1 << 23))


@dataclass
class SamplingBatch:
    """Per-row settings of the running batch as device tensors, plus host-side flags that pick the
    code path (so sampling never reads a device value back: it can be captured in a CUDA graph)."""

    temperature: torch.Tensor  # [n] float32 (0 = greedy)
    top_k: torch.Tensor        # [n] int64 (0 = off)
    top_p: torch.Tensor        # [n] float32 (1 = off)
    seed: torch.Tensor         # [n] int64
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool

    @classmethod
    def from_params(cls, params: list, device) -> "SamplingBatch":
        t = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        return cls(t, torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
                   torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
                   torch.tensor([seed_int64(p.seed) for p in params], dtype=torch.int64, device=device),
                   *flags(params))


def flags(params: list) -> tuple[bool, bool, bool]:
    """(all_greedy, any_top_k, any_top_p) of a batch's SamplingParams."""
    sampled = [p for p in params if p.temperature > 0]
    return not sampled, any(p.top_k > 0 for p in sampled), any(p.top_p < 1 for p in sampled)


def filtered_logprobs(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """logits [n, T, V] -> log-probabilities after temperature, top-k and top-p ([n, T, V], -inf = banned)."""
    return filtered_logits(logits, sb).log_softmax(-1)


def filtered_logits(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """logits [n, T, V] -> float32 logits / temperature after top-k and top-p ([n, T, V], -inf = banned): the
    log-probabilities up to a per-position constant."""
    temp = torch.where(sb.temperature > 0, sb.temperature, torch.ones_like(sb.temperature))
    x = logits.float() / temp[:, None, None]
    V = x.shape[-1]
    if sb.any_top_k:
        k = torch.where((sb.top_k > 0) & (sb.top_k < V), sb.top_k, torch.full_like(sb.top_k, V))
        kth = x.sort(dim=-1, descending=True).values.gather(-1, (k - 1)[:, None, None].expand(*x.shape[:2], 1))
        x = x.masked_fill(x < kth, float("-inf"))
    if sb.any_top_p:
        probs, order = x.softmax(-1).sort(dim=-1, descending=True)
        # keep the smallest prefix reaching p; rows with top_p = 1 keep everything (cumsum may round past 1)
        drop_sorted = (probs.cumsum(-1) - probs >= sb.top_p[:, None, None]) & (sb.top_p < 1)[:, None, None]
        x = x.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    return x


def sample(logits: torch.Tensor, sb: SamplingBatch, positions: torch.Tensor) -> torch.Tensor:
    """logits [n, T, V] predicting the tokens at positions [n, T] -> token ids [n, T] (int64)."""
    greedy = logits.argmax(-1)
    if sb.all_greedy:
        return greedy
    gumbel = -torch.log(-torch.log(uniform_noise(sb.seed, positions, logits.shape[-1])))
    # Gumbel-max = a draw from the law. Over the logits, not the log-probabilities: they differ by a constant per
    # position, and skipping the log_softmax keeps the float ops to the ones kernels/sample.py repeats exactly.
    sampled = (filtered_logits(logits, sb) + gumbel).argmax(-1)
    return torch.where(sb.temperature[:, None] > 0, sampled, greedy)


def accept(draft: torch.Tensor | None, target: torch.Tensor) -> torch.Tensor:
    """draft [n, B-1] (None for a block of one: nothing to accept), target samples [n, B] -> accepted draft
    count a [n].

    The committed tokens are target[:, :a+1]: the accepted drafts (equal to the target's samples)
    plus the target's bonus token."""
    if draft is None:
        return torch.zeros(target.shape[0], dtype=torch.long, device=target.device)
    return (draft == target[:, :-1]).long().cumprod(dim=1).sum(dim=1)


@dataclass
class Commit:
    """The runner's per-row decode state of rows [0, n), advanced in place once a step's samples are accepted."""

    start: torch.Tensor    # [n] int64 anchor positions
    last: torch.Tensor     # [n] int64 anchor token ids
    active: torch.Tensor   # [n] bool decoding rows
    limit: int             # a row stays active while its next block fits: start <= max_seq_len - block_size


def commit(target: torch.Tensor, a: torch.Tensor, c: Commit) -> None:
    """target samples [n, B], accepted counts a [n]: active rows move their anchor past the a accepted drafts
    and the bonus sample target[:, a], which becomes the next anchor token."""
    act = c.active
    new_start = torch.where(act, c.start + a + 1, c.start)
    c.last.copy_(torch.where(act, target.gather(1, a[:, None])[:, 0], c.last))
    c.start.copy_(new_start)
    # the host finishes a row with "length" once its next block would not fit; stop it here too, since the
    # next step may be enqueued before the host has read this one
    c.active.copy_(act & (new_start <= c.limit))
