# SPDX-License-Identifier: Apache-2.0
"""Synthetic MoE routing traces: the experts each token of a decode step is sent to, fed to the real expert kernels.

A step's expert cost follows the distinct experts its tokens touch, so the routing decides how much of it a DFlash
block pays over an AR step. Random router weights route near-uniformly, the worst case. A trace states the
routing instead:

  uniform  every token picks ``top_k`` distinct experts uniformly at random;
  skewed   per layer, expert popularity follows a Zipf law over a random ranking of the experts
           (p(rank r) ~ (r + 1) ** -zipf), and inside a DFlash block each top-k slot of position j keeps
           position j - 1's expert with probability ``reuse`` (neighbouring tokens share experts); the other
           slots are drawn from the Zipf law. The requests of a batch draw independently from the same
           per-layer popularity, so skew also shrinks the experts a large AR batch touches.

Both parameters are assumptions to vary, not measurements of gpt-oss routing.
"""
from __future__ import annotations

import dataclasses
import math
import zlib

import torch

ROUTINGS = ("uniform", "skewed")


@dataclasses.dataclass(frozen=True)
class Routing:
    name: str = "uniform"
    zipf: float = 0.0    # popularity exponent over the experts' ranks (0: all equally popular)
    reuse: float = 0.0   # probability a top-k slot repeats the previous block position's expert
    seed: int = 0

    def __post_init__(self):
        if self.name not in ROUTINGS:
            raise ValueError(f"--routing {self.name!r} is no routing; use one of {', '.join(ROUTINGS)}")
        if not (math.isfinite(self.zipf) and self.zipf >= 0):
            raise ValueError(f"--routing_zipf must be a finite number >= 0 (0 = uniform popularity), got {self.zipf}")
        if not 0 <= self.reuse <= 1:
            raise ValueError(f"--routing_reuse is a probability and must be in [0, 1], got {self.reuse}")
        if self.name == "uniform" and (self.zipf or self.reuse):
            raise ValueError(f"--routing uniform takes no skew (zipf {self.zipf}, reuse {self.reuse}); use skewed")

    @classmethod
    def parse(cls, name: str, zipf: float, reuse: float, seed: int) -> Routing:
        """The CLI's routing: skew parameters apply to 'skewed' only."""
        return cls(name, zipf, reuse, seed) if name == "skewed" else cls(name, seed=seed)

    def params(self) -> dict:
        return dataclasses.asdict(self)

    def trace(self, layers: int, n: int, B: int, num_experts: int, top_k: int) -> torch.Tensor:
        """Expert ids [layers, n * B, top_k] (int64, CPU) for a step of ``n`` requests x ``B`` positions, in the
        token order of the target's MoE input (request-major). Each token's ids are distinct; the same seed,
        layer and shape give the same trace."""
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts = {num_experts}], got {top_k}")
        if n < 1 or B < 1:
            raise ValueError(f"a step needs >= 1 request and >= 1 position, got n={n}, B={B}")
        out = []
        for layer in range(layers):
            # popularity depends on (seed, layer) only: every shape of a run sees the same hot experts
            rank_gen = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}:{layer}".encode()))
            popular = torch.randperm(num_experts, generator=rank_gen)      # expert id of rank 0, 1, ...
            weights = torch.empty(num_experts, dtype=torch.float64)
            weights[popular] = (torch.arange(num_experts, dtype=torch.float64) + 1) ** -self.zipf
            g = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}:{layer}:{n}:{B}".encode()))
            fresh = torch.multinomial(weights.expand(n * B, -1), top_k, replacement=False, generator=g)
            keep = torch.rand(n, B, top_k, generator=g, dtype=torch.float64) < self.reuse
            out.append(_reuse(fresh.view(n, B, top_k), keep).view(n * B, top_k))
        return torch.stack(out)


def _reuse(fresh: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """fresh [n, B, k] distinct draws per position; keep [n, B, k]: slot s of position j takes position j - 1's
    expert in slot s, the free slots take the fresh draws not already kept (in draw order), so ids stay distinct:
    at most r of the k fresh draws clash with the r kept experts, which leaves >= k - r for the k - r free slots."""
    ids = fresh.clone()
    for j in range(1, fresh.shape[1]):
        prev, kept, f = ids[:, j - 1], keep[:, j], fresh[:, j]
        clash = ((f[:, :, None] == prev[:, None, :]) & kept[:, None, :]).any(-1)   # [n, k]
        usable = f.gather(1, torch.argsort(clash.to(torch.int8), dim=1, stable=True))
        free_rank = ((~kept).long().cumsum(1) - 1).clamp(min=0)
        ids[:, j] = torch.where(kept, prev, usable.gather(1, free_rank))
    return ids


def distinct_experts(ids: torch.Tensor) -> int:
    """Sum over layers of the distinct experts that ids [layers, N, k] use."""
    return sum(layer.unique().numel() for layer in ids)


class TraceRouter:
    """Feeds a Routing's expert ids to every target layer's experts in place of the router's choice: a forward
    pre-hook on layer.mlp.experts swaps the ids argument. The router still runs and its weights are kept, so the
    step does the same work with the trace's experts. ``use(n, B)`` before each step (and before a CUDA graph
    capture: the capture bakes in the trace tensor of that shape)."""

    def __init__(self, routing: Routing, target, device):
        self.routing, self.target, self.device = routing, target, torch.device(device)
        self.traces: dict[tuple[int, int], torch.Tensor] = {}
        self.current: tuple[int, int] | None = None
        self.handles = []

    def use(self, n: int, B: int) -> None:
        if (n, B) not in self.traces:
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"TraceRouter: no trace for n, B = {(n, B)} yet and a CUDA graph is being "
                                   "captured; run the step once eagerly (or call use) before capturing it")
            c = self.target.config
            self.traces[(n, B)] = self.routing.trace(len(self.target.layers), n, B, c.num_experts,
                                                     c.experts_per_token).to(self.device)
        self.current = (n, B)

    def attach(self) -> TraceRouter:
        """Hooks the target's current experts modules (again after they were replaced, e.g. dequantised)."""
        self.detach()
        self.handles = [layer.mlp.experts.register_forward_pre_hook(self._hook(i))
                        for i, layer in enumerate(self.target.layers)]
        return self

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def _hook(self, layer: int):
        def swap(module, args):
            x, ids, weights = args
            if self.current is None:
                raise RuntimeError("TraceRouter: call use(n, B) before the step")
            t = self.traces[self.current][layer]
            if t.shape != ids.shape:
                raise RuntimeError(f"routing trace for n, B = {self.current} has ids {tuple(t.shape)}, the experts of "
                                   f"layer {layer} got {tuple(ids.shape)}")
            return x, t, weights
        return swap
