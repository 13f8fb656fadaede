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
from dataclasses import dataclass

import torch

from ..config import RuntimeConfig, SamplingParams
from .distributed import TPGroup
from .graphs import capture
from .kv_cache import KVCache
from .sampling import Commit, SamplingBatch, accept, commit, flags, sample, seed_int64


@dataclass
class Launched:
    """A step enqueued on the device: where its results land and how to read them."""

    host: torch.Tensor            # pinned: first tokens [m], samples [n * block], accepted [n]
    m: int                        # prefill rows
    first_rows: dict[int, int]    # slot -> prefill row, for the prompts this step completes
    n: int                        # decode rows [0, n) (0 = no decode)
    block: int
    event: object                 # torch.cuda.Event recorded after the copies (None on the CPU)


class Runner:
    def __init__(self, target, drafter, cfg: RuntimeConfig, tp: TPGroup, block_size: int,
                 propose: Callable | None = None):
        self.target, self.drafter, self.cfg, self.tp, self.block_size = target, drafter, cfg, tp, block_size
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        n, S = cfg.max_batch_size, cfg.max_seq_len
        # One extra slot past the last: the rows a padded prefill adds to reach its graph's row bucket point at
        # it, so their cache writes and state updates land where no request reads (nothing decodes slot n).
        self.scratch = n
        N = n + 1

        def cache_for(model) -> KVCache:   # one row per slot (+ the scratch row), max_seq_len positions
            L, H, D = model.kv_shape()
            return KVCache(L, N, H, S, D, self.dtype, self.device)
        self.cache = cache_for(target)
        self.draft_cache = cache_for(drafter) if block_size > 1 else None
        self.mask_token_id = drafter.config.mask_token_id if drafter is not None else 0
        self.propose = propose or self.draft
        self.start = torch.zeros(N, dtype=torch.long, device=self.device)  # [max_batch + 1] anchor positions
        self.last = torch.zeros(N, dtype=torch.long, device=self.device)   # [max_batch + 1] anchor token ids
        self.active = torch.zeros(N, dtype=torch.bool, device=self.device)  # [max_batch + 1] decoding rows
        self.start_host = [0] * N                 # host copies: the step's KV length without a device read
        self.decoding_host = [False] * N
        # Per-slot sampling settings live in fixed buffers so a captured CUDA graph reads them in place.
        self._sp = SamplingBatch.from_params([SamplingParams()] * N, self.device)
        self._params: list[SamplingParams | None] = [None] * N
        self._flags: tuple[bool, bool, bool] | None = None
        self._t = torch.zeros(n, block_size, dtype=torch.long, device=self.device)  # [max_batch, B] samples
        self._a = torch.zeros(n, dtype=torch.long, device=self.device)              # [max_batch] accepted
        self._arange = torch.arange(block_size, device=self.device)
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.use_graphs = cfg.cuda_graphs and self.device.type == "cuda"
        # The step's sampling + acceptance kernels: as chosen with the target's (Kernels.sampling; the engine checked
        # that choice against RuntimeConfig.kernels), at any tp size. Under TP they need no broadcast of rank 0's
        # samples: every rank reads the same bits (the logits are all-gathered, the drafts broadcast, the seeds and
        # positions mirrored) and the kernels are deterministic (fixed splits, no atomics), so every rank commits
        # the same tokens.
        self._sample_kernels = None
        if target.kernels.sampling:
            from .kernels import sample as sample_kernels
            self._sample_kernels = sample_kernels
        self.captured_mid_run = 0                 # graphs captured after warm_up(): each one a stall
        self._warm = False
        # Prefill runs at padded shapes (rows, tokens, keys) rounded up to buckets wherever graphs replay it, so a
        # few graphs captured at start-up serve every prompt; exact shapes otherwise (the CPU: padding is compute).
        self.pad_shapes = self.use_graphs
        self.max_chunk = min(S, cfg.max_num_tokens)   # prompt tokens one row may prefill in one step
        pin = self.device.type == "cuda"
        # Staging of a prefill's inputs, flat so that the [2, rows, tokens] and [5, rows] views of any shape are
        # contiguous (one pinned -> device copy each) and sit at the addresses its graph was captured with. Two host
        # buffers, by step parity like the results': step k+1 is staged while step k's copy may still be queued.
        self._p_host = [torch.zeros(2 * n * self.max_chunk, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self._p_dev = torch.zeros(2 * n * self.max_chunk, dtype=torch.long, device=self.device)
        self._r_host = [torch.zeros(5 * n, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self._r_dev = torch.zeros(5 * n, dtype=torch.long, device=self.device)
        # results of a step: first tokens [max_batch], samples [max_batch, B], accepted [max_batch]
        self._res_host = [torch.zeros(n * (block_size + 2), dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self._parity = 0
        self._first = torch.zeros(n, dtype=torch.long, device=self.device)          # [max_batch] first tokens
        # Block-1 steps keep the drafter's context current. One append per step was 1.6 ms of a 60 ms smollm2-135m
        # CPU step, ~25 small ops for one token, and on the GPU the drafter work that made a block-1 step cost
        # more than an AR step: so their features wait here and go in as one append of up to ``stash_steps``
        # tokens, before anything reads or rewrites the drafter cache (a drafting step, a prefill, a slot changing
        # hands). A block-1 step is then the AR step plus keeping its features. Under CUDA graphs the graph writes
        # them to fixed buffers (_held_feats/_held_pos) and launch_decode stashes them after the replay (the
        # stash column changes every step; a graph cannot follow it).
        self.stash_steps = 32
        self._stash_feats: torch.Tensor | None = None   # [max_batch, stash_steps, n_feat * hidden]
        self._stash_pos: torch.Tensor | None = None     # [max_batch, stash_steps]
        self._held_feats: torch.Tensor | None = None    # [max_batch, n_feat * hidden] a graphed block-1 step's
        self._held_pos: torch.Tensor | None = None      # [max_batch]
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
    def prefill_shape(self, m: int, T: int) -> tuple[int, int]:
        """(rows, tokens per row) a prefill of m chunks of at most T tokens runs at: powers of two where graphs
        replay it (rows capped at max_batch_size, tokens at least 16), exact otherwise. The scheduler budgets
        these padded shapes, so every shape it can ask for is one warm_up() captured."""
        if not self.pad_shapes:
            return m, T
        return _bucket(m, self.cfg.max_batch_size, 1), _bucket(T, self.max_chunk, 16)

    def chunk_cap(self, budget: int) -> int:
        """The longest first chunk a step with ``budget`` prompt tokens can take (at least one bucket)."""
        if not self.pad_shapes:
            return max(1, min(budget, self.max_chunk))
        cap = 16
        while cap * 2 <= min(budget, self.max_chunk):
            cap *= 2
        return cap

    @torch.inference_mode()
    def prefill(self, chunks: list[tuple[int, int, int]], prompts: dict[int, list[int]]) -> dict[int, int]:
        """Launch prompt tokens [begin, end) of each slot's prompt into the caches, in one forward at the padded
        shape (a graph replay where graphs are on). The first tokens of the prompts this completes are sampled on
        the device into self._first[:len(chunks)] and read with the step's results (collect()); nothing here waits
        for the device. Returns {slot: its row in self._first} for the prompts this completes."""
        if not chunks:
            return {}
        self.flush_context()
        m, T = len(chunks), max(end - begin for _, begin, end in chunks)
        m_pad, T_pad = self.prefill_shape(m, T)
        kv = max(e for *_, e in chunks)
        kv_pad = _bucket(kv, self.cfg.max_seq_len, T_pad) if self.pad_shapes else kv
        tok, row = self._staging(m_pad, T_pad, host=True)   # [2, m_pad, T_pad] ids, positions; [5, m_pad]
        # padded rows: the scratch slot, positions 0.., never done; padding sits past each chunk's end (clamped
        # inside the cache): later tokens overwrite it before any query can see it (keys are masked by position)
        S, j = self.cfg.max_seq_len, torch.arange(T_pad)
        row.zero_()
        row[0] = self.scratch
        row[:, :m] = torch.tensor([[s, e - b - 1, e, int(e == len(prompts[s])), 0]      # slot, last index, plen, done
                                   for s, b, e in chunks]).T
        tok[0] = 0
        tok[0, :m][j < (row[1, :m] + 1)[:, None]] = torch.tensor(   # each chunk's ids, row-major as the mask runs
            [t for s, b, e in chunks for t in prompts[s][b:e]], dtype=torch.long)
        tok[1] = j.clamp(max=S - 1)
        tok[1, :m] = (torch.tensor([b for _, b, _ in chunks])[:, None] + j).clamp_(max=S - 1)
        dev_tok, dev_row = self._staging(m_pad, T_pad, host=False)
        dev_tok.copy_(tok, non_blocking=True)
        dev_row.copy_(row, non_blocking=True)
        if self.use_graphs:
            self._graph(("prefill", m_pad, T_pad, kv_pad), lambda: self.prefill_tensors(m_pad, T_pad, kv_pad))()
        else:
            self.prefill_tensors(m_pad, T_pad, kv_pad)
        for s, _, e in chunks:
            self.start_host[s], self.decoding_host[s] = e, e == len(prompts[s])
        return {s: i for i, (s, _, e) in enumerate(chunks) if e == len(prompts[s])}

    def _staging(self, m: int, T: int, host: bool) -> tuple[torch.Tensor, torch.Tensor]:
        p, r = (self._p_host[self._parity], self._r_host[self._parity]) if host else (self._p_dev, self._r_dev)
        return p[: 2 * m * T].view(2, m, T), r[: 5 * m].view(5, m)

    def _stage_idle(self, m: int, T: int) -> None:
        """Stage m padded rows of T tokens (the scratch slot, positions 0.., never done) for a warm-up prefill: the
        staging views of different shapes overlap, so each capture stages its own."""
        tok, row = self._staging(m, T, host=False)
        tok[0], tok[1] = 0, torch.arange(T, device=self.device).clamp_(max=self.cfg.max_seq_len - 1)
        row.zero_()
        row[0] = self.scratch

    def prefill_tensors(self, m: int, T: int, kv_len: int) -> None:
        """The prefill of the staged chunks (rows [0, m) of the staging buffers, T tokens each) attending over
        cache[:kv_len]; device work only (graph-safe). First tokens land in self._first[:m]."""
        tok, row = self._staging(m, T, host=False)
        ids, pos = tok[0], tok[1]                                                             # [m, T]
        rows, last_idx, plen, done = row[0], row[1], row[2], row[3].bool()                    # [m]
        h, feats = self.target(ids, pos, self.cache, rows, kv_len)
        if self.block_size > 1:
            self._append_context(feats, pos, rows)
        last_h = h.gather(1, last_idx[:, None, None].expand(m, 1, h.shape[-1]))             # [m, 1, hidden]
        # every sampling path at once: rows with top_k 0 / top_p 1 / temperature 0 get exactly the tokens of the
        # narrower paths, and one path means one graph per shape
        sp = self._sp
        sb = SamplingBatch(sp.temperature[rows], sp.top_k[rows], sp.top_p[rows], sp.seed[rows], False, True, True)
        first = self.tp.broadcast(sample(self.target.logits(last_h), sb, plen[:, None])[:, 0])  # [m]
        self.start[rows] = plen
        self.last[rows] = torch.where(done, first, self.last[rows])
        self.active[rows] = done
        self._first[:m] = first

    # ---- decode ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, n: int, block: int) -> tuple[list[list[int]], list[int]]:
        """One draft + verify of ``block`` tokens over slots [0, n), waited for. Returns the target's samples
        [n][block] and the accepted draft counts [n] (rows that are not decoding are left unchanged)."""
        _, t, a = self.collect(self.launch([], {}, n, block))
        self.advance([i for i in range(n) if self.decoding_host[i]], a)
        return t, a

    @torch.inference_mode()
    def launch_decode(self, n: int, block: int, ahead: int = 0) -> None:
        """Enqueue one draft + verify over slots [0, n). ``ahead``: tokens a step still in flight may add to any
        row (the host's positions lag the device's by that step), so the keys read stay an upper bound."""
        kv_len = min(max(self.start_host[:n]) + ahead + block, self.cfg.max_seq_len)
        if block > 1 or n != self._stash_rows:
            self.flush_context()
        if self.use_graphs:  # one graph per (batch bucket, cache-length bucket, block, sampling path)
            rows, kv = self.graph_shape(n, kv_len)
            self._graph((rows, kv, block, self._sampling_flags()), lambda: self.step_tensors(rows, kv, block))()
            if block == 1 and self.block_size > 1 and self.stash_steps:
                self._stash_context(self._held_feats[:n, None], self._held_pos[:n, None], n)
        else:
            self.step_tensors(n, kv_len, block)

    @torch.inference_mode()
    def launch(self, chunks: list[tuple[int, int, int]], prompts: dict[int, list[int]], n: int, block: int,
               ahead: int = 0) -> "Launched":
        """Enqueue a whole step (the prefill of ``chunks``, then a draft + verify over slots [0, n)) and the copy of
        its results to pinned host memory; returns at once. collect() waits for them: the host works on the
        previous step while the device runs this one."""
        first_rows = self.prefill(chunks, prompts)
        if n:
            self.launch_decode(n, block, ahead)
        m, block = len(chunks), min(block, self.block_size)   # a larger block verifies the drafter's block_size
        host = self._res_host[self._parity]                       # pinned; alternate buffers, one per step in flight
        self._parity ^= 1
        host[:m].copy_(self._first[:m], non_blocking=True)
        host[m: m + n * block].view(n, block).copy_(self._t[:n, :block], non_blocking=True)
        host[m + n * block: m + n * (block + 1)].copy_(self._a[:n], non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return Launched(host, m, first_rows, n, block, event)

    def collect(self, step: "Launched") -> tuple[dict[int, int], list[list[int]], list[int]]:
        """The step's one host sync: {slot: first token} of the prompts its prefill completed, and for its decode
        over rows [0, n) the samples [n][block] and accepted counts [n] (then advance() the rows)."""
        if step.event is not None:
            step.event.synchronize()
        m, n, block = step.m, step.n, step.block
        flat = step.host[: m + n * (block + 1)].tolist()
        firsts = {s: flat[i] for s, i in step.first_rows.items()}
        t_flat, a_host = flat[m: m + n * block], flat[m + n * block:]
        return firsts, [t_flat[i * block:(i + 1) * block] for i in range(n)], a_host

    def advance(self, slots: list[int], accepted: list[int]) -> None:
        """The host's copy of the anchor positions follows the device's for the slots that decoded."""
        start = self.start_host
        for i in slots:
            start[i] += accepted[i] + 1

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
        # [n, B] positions of the full block; clamped: a row that reached the end of its cache row is inactive but may
        # still run in the step launched before the host saw it finish (its results are dropped)
        pos = (start[:, None] + self._arange).clamp_(max=self.cfg.max_seq_len - 1)
        vpos = pos[:, :block]                                            # [n, b] positions verified
        draft = self.tp.broadcast(self.propose(last, pos, start, rows, min(kv_len - block + B, self.cfg.max_seq_len),
                                               block - 1))[:, : block - 1] if block > 1 else None   # [n, b-1]
        ids = torch.cat([last[:, None], draft], 1) if block > 1 else last[:, None]   # [n, b]
        h, feats = self.target(ids, vpos, self.cache, rows, kv_len)
        logits, sb = self.target.logits(h), self._sampling(n)            # [n, b, V]
        state = Commit(start, last, self.active[:n], self.cfg.max_seq_len - B)
        K = self._sample_kernels
        if K is not None and K.handles(sb):   # two Triton kernels sample, accept and commit (kernels/sample.py)
            K.sample_accept(logits, sb, vpos + 1, draft, self._t[:n, :block], self._a[:n], state)
        else:
            t = self.tp.broadcast(sample(logits, sb, vpos + 1))          # [n, b] target samples
            a = accept(draft, t)                                         # [n]
            commit(t, a, state)
            self._t[:n, :block], self._a[:n] = t, a
        if B > 1 and block == 1 and self.stash_steps:
            if self.use_graphs:   # fixed addresses; launch_decode stashes them after the replay
                self._hold(feats, vpos, n)
            else:
                self._stash_context(feats, vpos, n)
        elif B > 1:  # drafter context for the verified tokens; rows past the accepted prefix are overwritten later
            self._append_context(feats, vpos, rows)

    # ---- drafter context ----------------------------------------------------------------------
    def _append_context(self, feats, pos, rows) -> None:
        self.context_appends += 1
        self.drafter.append_context(feats, pos, self.draft_cache, rows)

    def _hold(self, feats, pos, n: int) -> None:
        """A graphed block-1 step's features feats [n, 1, F] and positions pos [n, 1] -> the fixed buffers."""
        if self._held_feats is None:    # first made by a capture's warm-up run, outside the capture
            self._held_feats = feats.new_zeros(self.cfg.max_batch_size, feats.shape[-1])
            self._held_pos = torch.zeros(self.cfg.max_batch_size, dtype=torch.long, device=self.device)
        self._held_feats[:n].copy_(feats[:, 0])
        self._held_pos[:n].copy_(pos[:, 0])

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

    def _graph(self, key: tuple, fn: Callable[[], None]):
        """The CUDA graph of ``fn`` (graph-safe device work at fixed shapes), captured on first use."""
        if key not in self._graphs:
            if self._warm:
                self.captured_mid_run += 1
            saved = (self.active.clone(), self.start.clone(), self.last.clone())
            self.active.zero_()  # warm-up runs must not advance any request (their cache writes land past `start`)
            if not hasattr(self, "_pool"):
                self._pool = torch.cuda.graph_pool_handle()
            graph, _ = capture(fn, pool=self._pool)
            for buf, old in zip((self.active, self.start, self.last), saved):
                buf.copy_(old)   # a prefill's warm-up runs write its rows' state: put it back
            self._graphs[key] = graph
        return self._graphs[key].replay

    @torch.inference_mode()
    def warm_up(self, blocks: list[int]) -> dict:
        """Capture, before any request, every graph a step can replay: decode at each batch bucket x KV-length
        bucket x block in ``blocks`` x the greedy and plain-sampling paths, and prefill at each (rows, tokens)
        bucket the token budget admits (new prompts: keys = tokens; a continued prompt: one row, keys > tokens).
        After this, a capture mid-run (top-k/top-p sampling, a block the policy was not warmed for) is counted in
        ``captured_mid_run``."""
        if not self.use_graphs:
            return {"graphs": 0, "seconds": 0.0}
        import time
        t0 = time.perf_counter()
        n, S = self.cfg.max_batch_size, self.cfg.max_seq_len
        rows = sorted({_bucket(k, n, 1) for k in range(1, n + 1)})
        kvs = sorted({_bucket(k, S, 256) for k in range(1, S + 1, 64)} | {S})
        saved_flags = self._flags
        for flags_ in ((True, False, False), (False, False, False)):
            self._flags = flags_
            for r in rows:
                for kv in kvs:
                    for b in blocks:
                        if kv >= b:
                            self._graph((r, kv, b, flags_), lambda r=r, kv=kv, b=b: self.step_tensors(r, kv, b))
        self._flags = saved_flags
        for T in sorted({_bucket(t, self.max_chunk, 16) for t in range(1, self.max_chunk + 1, 16)} | {self.max_chunk}):
            for r in rows:
                if r == 1 or r * T <= self.cfg.max_num_tokens:
                    self._stage_idle(r, T)
                    self._graph(("prefill", r, T, T), lambda r=r, T=T: self.prefill_tensors(r, T, T))
            for kv in sorted({_bucket(k, S, T) for k in range(T + 1, S + 1)} - {T}):   # a continued prompt
                self._stage_idle(1, T)
                self._graph(("prefill", 1, T, kv), lambda T=T, kv=kv: self.prefill_tensors(1, T, kv))
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self._warm = True
        return {"graphs": len(self._graphs), "seconds": time.perf_counter() - t0}

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def _sampling_flags(self) -> tuple[bool, bool, bool]:
        """Three sampling paths, not eight: greedy, plain temperature sampling, and everything on (top_k 0 and
        top_p 1 filter nothing, so rows without them get the same tokens on the full path)."""
        if self._flags is None:
            greedy, k, p = flags([q for q in self._params if q is not None])
            self._flags = (greedy, False, False) if greedy or not (k or p) else (False, True, True)
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
