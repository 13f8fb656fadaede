# SPDX-License-Identifier: Apache-2.0
"""The device side of the engine: KV caches, the per-slot step tensors, prompt prefill (chunked) and the
draft + verify step, captured as CUDA graphs where the shapes repeat.

Vocabulary (z-lab's): ``block`` = 1 anchor + block-1 drafted tokens; ``start`` = position of the last
committed token, which the target has not processed yet (the block's anchor). Rows of slots that are
still prefilling keep ``start`` at their prefill progress: a decode step's writes into those rows land
exactly where their next chunk writes, so they never leave stale K/V behind.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import RuntimeConfig, SamplingParams
from .distributed import TPGroup
from .kv_cache import KVCache
from .sampling import SamplingBatch, accept, flags, sample, seed_int64


class Runner:
    def __init__(self, target, drafter, cfg: RuntimeConfig, tp: TPGroup, block_size: int,
                 propose: Callable | None = None):
        self.target, self.drafter, self.cfg, self.tp, self.block_size = target, drafter, cfg, tp, block_size
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        n, S = cfg.max_batch_size, cfg.max_seq_len

        def cache_for(model) -> KVCache:   # one row per slot, max_seq_len positions
            L, H, D = model.kv_shape()
            return KVCache(L, n, H, S, D, self.dtype, self.device)
        self.cache = cache_for(target)
        self.draft_cache = cache_for(drafter) if block_size > 1 else None
        self.mask_token_id = drafter.config.mask_token_id if drafter is not None else 0
        self.propose = propose or self.draft
        self.start = torch.zeros(n, dtype=torch.long, device=self.device)  # [max_batch] anchor positions
        self.last = torch.zeros(n, dtype=torch.long, device=self.device)   # [max_batch] anchor token ids
        self.active = torch.zeros(n, dtype=torch.bool, device=self.device)  # [max_batch] decoding rows
        self.start_host = [0] * n                 # host copies: the step's KV length without a device read
        self.decoding_host = [False] * n
        # Per-slot sampling settings live in fixed buffers so a captured CUDA graph reads them in place.
        self._sp = SamplingBatch.from_params([SamplingParams()] * n, self.device)
        self._params: list[SamplingParams | None] = [None] * n
        self._flags: tuple[bool, bool, bool] | None = None
        self._t = torch.zeros(n, block_size, dtype=torch.long, device=self.device)  # [max_batch, B] samples
        self._a = torch.zeros(n, dtype=torch.long, device=self.device)              # [max_batch] accepted
        self._arange = torch.arange(block_size, device=self.device)
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.use_graphs = cfg.cuda_graphs and self.device.type == "cuda"
        # Block-1 steps keep the drafter's context current. Eagerly (CPU) one append per step was 1.6 ms of a
        # 60 ms smollm2-135m step, ~25 small ops for one token: so their features wait here and go in as one
        # append of up to ``stash_steps`` tokens, before anything reads or rewrites the drafter cache (a drafting
        # step, a prefill, a slot changing hands). Under CUDA graphs the append stays inside the graph (0).
        self.stash_steps = 0 if self.use_graphs else 32
        self._stash_feats: torch.Tensor | None = None   # [max_batch, stash_steps, n_feat * hidden]
        self._stash_pos: torch.Tensor | None = None     # [max_batch, stash_steps]
        self._stash_len, self._stash_rows = 0, 0
        self.context_appends = 0                  # drafter append_context calls (tests count them)

    # ---- slots ----------------------------------------------------------------------------------
    def admit(self, slot: int, params: SamplingParams) -> None:
        self._sp.temperature[slot], self._sp.top_k[slot], self._sp.top_p[slot], self._sp.seed[slot] = (
            params.temperature, params.top_k, params.top_p, seed_int64(params.seed))
        self._params[slot], self._flags = params, None
        self.release(slot, keep_params=True)   # flushes the stashed drafter context before the row changes hands

    def release(self, slot: int, keep_params: bool = False) -> None:
        self.flush_context()
        self.active[slot], self.start[slot], self.last[slot] = False, 0, 0
        self.start_host[slot], self.decoding_host[slot] = 0, False
        if not keep_params:
            self._params[slot], self._flags = None, None

    # ---- prefill --------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, chunks: list[tuple[int, int, int]], prompts: dict[int, list[int]]) -> dict[int, int]:
        """Prompt tokens [begin, end) of each slot's prompt into the caches, in one padded forward.
        Returns {slot: first sampled token} for the slots whose prompt this completes."""
        if not chunks:
            return {}
        self.flush_context()
        m, T = len(chunks), max(end - begin for _, begin, end in chunks)
        # padding sits past each chunk's end (clamped inside the cache): later tokens overwrite it before
        # any query can see it (keys are masked by position)
        pos = torch.tensor([[min(b + j, self.cfg.max_seq_len - 1) for j in range(T)] for _, b, _ in chunks],
                           device=self.device)                                               # [m, T]
        ids = torch.tensor([prompts[s][b:e] + [0] * (T - e + b) for s, b, e in chunks], device=self.device)
        rows = torch.tensor([s for s, _, _ in chunks], device=self.device)                   # [m]
        first_chunk = all(b == 0 for _, b, _ in chunks)  # attend within the chunk; else over the cache
        h, feats = self.target(ids, pos, self.cache, rows, None if first_chunk else max(e for *_, e in chunks))
        if self.block_size > 1:
            self._append_context(feats, pos, rows)
        ends = torch.tensor([e - b - 1 for _, b, e in chunks], device=self.device)            # [m] last real index
        last_h = h[torch.arange(m, device=self.device), ends][:, None]                        # [m, 1, hidden]
        sb = SamplingBatch.from_params([self._params[s] for s, _, _ in chunks], self.device)
        plen = torch.tensor([e for *_, e in chunks], device=self.device)
        first = self.tp.broadcast(sample(self.target.logits(last_h), sb, plen[:, None])[:, 0])  # [m]
        done = torch.tensor([e == len(prompts[s]) for s, _, e in chunks], device=self.device)
        self.start[rows] = plen
        self.last[rows] = torch.where(done, first, self.last[rows])
        self.active[rows] = done
        for s, _, e in chunks:
            self.start_host[s], self.decoding_host[s] = e, e == len(prompts[s])
        return {s: tok for (s, _, e), tok in zip(chunks, first.tolist()) if e == len(prompts[s])}

    # ---- decode ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, n: int, block: int) -> tuple[list[list[int]], list[int]]:
        """One draft + verify of ``block`` tokens over slots [0, n). Returns the target's samples [n][block]
        and the accepted draft counts [n] (rows that are not decoding are left unchanged)."""
        kv_len = max(self.start_host[:n]) + block
        if block > 1 or n != self._stash_rows:
            self.flush_context()
        if self.use_graphs:  # one graph per (batch bucket, cache-length bucket, block, sampling path)
            self._graph(*self.graph_shape(n, kv_len), block)()
        else:
            self.step_tensors(n, kv_len, block)
        t_host, a_host = self._t[:n, :block].tolist(), self._a[:n].tolist()   # the one host sync per step
        for i in range(n):
            if self.decoding_host[i]:
                self.start_host[i] += a_host[i] + 1
        return t_host, a_host

    def graph_shape(self, n: int, kv_len: int) -> tuple[int, int]:
        """(rows, KV length) that a graphed step over rows [0, n) and cache[:kv_len] runs at: each rounded up
        to its bucket. Rows past n are idle slots (inactive: nothing advances) and keys past kv_len are masked."""
        return _bucket(n, self.cfg.max_batch_size, 1), _bucket(kv_len, self.cfg.max_seq_len, 256)

    def step_tensors(self, n: int, kv_len: int, block: int) -> None:
        """Draft, verify, accept and advance rows [0, n) over cache[:kv_len]; device work only (graph-safe).
        The drafter always runs its trained block (its attention over the mask tokens is what it learned);
        the target verifies the first ``block - 1`` drafts. Results land in self._t and self._a."""
        B, rows = self.block_size, slice(0, n)
        start, last = self.start[:n], self.last[:n]                      # [n]
        pos = start[:, None] + self._arange                              # [n, B] positions of the full block
        vpos = pos[:, :block]                                            # [n, b] positions verified
        draft = self.tp.broadcast(self.propose(last, pos, start, rows, min(kv_len - block + B, self.cfg.max_seq_len),
                                               block - 1))[:, : block - 1] if block > 1 else None   # [n, b-1]
        ids = torch.cat([last[:, None], draft], 1) if block > 1 else last[:, None]   # [n, b]
        h, feats = self.target(ids, vpos, self.cache, rows, kv_len)
        t = self.tp.broadcast(sample(self.target.logits(h), self._sampling(n), vpos + 1))  # [n, b] target samples
        a = accept(draft, t) if block > 1 else torch.zeros_like(start)  # [n]
        if B > 1 and block == 1 and self.stash_steps:
            self._stash_context(feats, vpos, n)
        elif B > 1:  # drafter context for the verified tokens; rows past the accepted prefix are overwritten later
            self._append_context(feats, vpos, rows)
        act = self.active[:n]
        self.last[:n] = torch.where(act, t.gather(1, a[:, None])[:, 0], last)
        self.start[:n] = torch.where(act, start + a + 1, start)
        self._t[:n, :block], self._a[:n] = t, a

    # ---- drafter context ----------------------------------------------------------------------
    def _append_context(self, feats, pos, rows) -> None:
        self.context_appends += 1
        self.drafter.append_context(feats, pos, self.draft_cache, rows)

    def _stash_context(self, feats, pos, n: int) -> None:
        """Hold one block-1 step's features feats [n, 1, F] at positions pos [n, 1] for a later batched append."""
        if self._stash_feats is None or self._stash_feats.shape[1] != self.stash_steps:
            self._stash_feats = feats.new_zeros(self.cfg.max_batch_size, self.stash_steps, feats.shape[-1])
            self._stash_pos = torch.zeros(self.cfg.max_batch_size, self.stash_steps, dtype=torch.long,
                                          device=self.device)
        j = self._stash_len
        self._stash_feats[:n, j] = feats[:, 0]
        self._stash_pos[:n, j] = pos[:, 0]
        self._stash_len, self._stash_rows = j + 1, n
        if self._stash_len == self.stash_steps:
            self.flush_context()

    def flush_context(self) -> None:
        """Append the stashed block-1 features in step order (one call). A row's positions only repeat while it
        is not decoding, and those rows are rewritten by their next prefill chunk, which flushes first."""
        if self._stash_len:
            n, j = self._stash_rows, self._stash_len
            with torch.inference_mode():
                self._append_context(self._stash_feats[:n, :j], self._stash_pos[:n, :j], slice(0, n))
        self._stash_len = 0

    def draft(self, last, pos, start, rows, ctx_len: int, num_drafts: int | None = None) -> torch.Tensor:
        """One drafter pass over [last, mask x (B-1)] at positions pos [n, B] -> argmax drafts [n, num_drafts]
        (default B-1). Only the drafts the step verifies go through the lm_head: at block 2 of 16 that is one
        row instead of 15, which on a CPU cost more than the whole target step (smollm2-135m: block 2 took 159
        ms against 64 ms at block 1 with all 15 rows)."""
        n, B = pos.shape
        k = B - 1 if num_drafts is None else num_drafts
        ids = torch.cat([last[:, None], torch.full((n, B - 1), self.mask_token_id, device=self.device)], 1)
        h = self.drafter(self.target.embed(ids), pos, start, self.draft_cache, rows, ctx_len)   # [n, B, hidden]
        return self.target.logits(h[:, 1:1 + k]).argmax(-1)                                      # [n, k]

    def _graph(self, n: int, kv_len: int, block: int):
        """The CUDA graph of step_tensors for this shape, captured on first use."""
        key = (n, kv_len, block, self._sampling_flags())
        if key not in self._graphs:
            saved = self.active.clone()
            self.active.zero_()  # warm-up runs must not advance any request (their cache writes land past `start`)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.step_tensors(n, kv_len, block)
            torch.cuda.current_stream().wait_stream(side)
            self.active.copy_(saved)
            graph = torch.cuda.CUDAGraph()
            if not hasattr(self, "_pool"):
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._pool):
                self.step_tensors(n, kv_len, block)
            self._graphs[key] = graph
        return self._graphs[key].replay

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def _sampling_flags(self) -> tuple[bool, bool, bool]:
        if self._flags is None:
            self._flags = flags([p for p in self._params if p is not None])
        return self._flags

    def _sampling(self, n: int) -> SamplingBatch:
        sp = self._sp
        return SamplingBatch(sp.temperature[:n], sp.top_k[:n], sp.top_p[:n], sp.seed[:n], *self._sampling_flags())


def _bucket(x: int, cap: int, floor: int) -> int:
    """Round up to a power of two (at least ``floor``, at most ``cap``): few shapes, few CUDA graphs."""
    b = floor
    while b < x:
        b *= 2
    return min(b, cap)
