# SPDX-License-Identifier: Apache-2.0
"""The torch DFlash runtime: continuous batching over a static KV cache, one draft + verify per step.

Vocabulary (z-lab's): ``block_size`` B = 1 anchor + B-1 drafted tokens; ``start`` = position of the last
committed token, which the target has not processed yet (it is the block's anchor); ``acceptance
length`` = tokens committed by one verify = accepted drafts + 1 bonus. ``block_size == 1`` is plain
autoregressive decoding through the same loop.

Threading: ``add_request`` and ``cancel`` may be called from any thread; ``step`` from one thread only.
Tensor parallelism: every rank runs ``step``; rank 0 decides which requests enter and leave and
broadcasts that, ranks > 0 call ``follow()``.
"""
from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..checkpoints import hf, validate
from ..config import RequestStats, RuntimeConfig, SamplingParams
from ..errors import DFlashError
from . import fp8
from .distributed import TPGroup, init_tp
from .kv_cache import KVCache
from .loader import load_drafter, load_target
from .models import target_config
from .sampling import SamplingBatch, accept, flags, sample, seed_int64

_PREFILL_TOKENS = 8192  # prompt tokens per prefill forward (bounds activation memory)
_ids = itertools.count()


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    on_tokens: Callable[["Request", list[int]], None] | None = None
    request_id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    finish_reason: str | None = None  # "stop" | "length" | "cancelled"
    slot: int = -1
    t_arrival: float = field(default_factory=time.perf_counter)
    done_event: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


def _resolve(cfg: RuntimeConfig) -> tuple[torch.device, torch.dtype]:
    dev = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                       "cpu" if cfg.device == "auto" else cfg.device)
    dtype = {"auto": torch.bfloat16 if dev.type == "cuda" else torch.float32, "float32": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}[cfg.dtype]
    if cfg.fp8_gemm:   # asked for explicitly: refuse off Hopper/Ada before loading (None = auto, in the loader)
        fp8.check_device(dev, dtype)
    return dev, dtype


class Engine:
    def __init__(self, target, drafter, tokenizer, cfg: RuntimeConfig, tp: TPGroup, eos_ids: set[int]):
        self.target, self.drafter, self.tokenizer, self.cfg, self.tp = target, drafter, tokenizer, cfg, tp
        self.block_size = cfg.block_size or (drafter.config.block_size if drafter is not None else 1)
        if self.block_size > 1 and drafter is None:
            raise DFlashError("drafter", f"block_size {self.block_size} needs a drafter", "pass --drafter or use block_size 1")
        p = next(target.parameters())
        self.device, self.dtype, self.eos_ids = p.device, p.dtype, set(eos_ids)
        n = cfg.max_batch_size
        self.cache = KVCache(*target.kv_shape()[:1], n, *target.kv_shape()[1:2], cfg.max_seq_len,
                             target.kv_shape()[2], self.dtype, self.device)
        self.draft_cache = (KVCache(drafter.kv_shape()[0], n, drafter.kv_shape()[1], cfg.max_seq_len,
                                    drafter.kv_shape()[2], self.dtype, self.device) if self.block_size > 1 else None)
        self.mask_token_id = drafter.config.mask_token_id if drafter is not None else 0
        self.slots: list[Request | None] = [None] * n
        self.start = torch.zeros(n, dtype=torch.long, device=self.device)  # [max_batch] anchor positions
        self.last = torch.zeros(n, dtype=torch.long, device=self.device)   # [max_batch] anchor token ids
        self.active = torch.zeros(n, dtype=torch.bool, device=self.device)
        self._start_host = [0] * n
        # Per-slot sampling settings live in fixed buffers so a captured CUDA graph reads them in place.
        self._sp = SamplingBatch.from_params([SamplingParams()] * n, self.device)
        self._flags: tuple[bool, bool, bool] | None = None
        self._t = torch.zeros(n, self.block_size, dtype=torch.long, device=self.device)  # [max_batch, B] samples
        self._a = torch.zeros(n, dtype=torch.long, device=self.device)                   # [max_batch] accepted
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.use_graphs = cfg.cuda_graphs and self.device.type == "cuda"
        self._waiting: deque[Request] = deque()
        self._cancel: set[int] = set()
        self._lock = threading.Lock()
        self._arange = torch.arange(self.block_size, device=self.device)
        self.counters = {"steps": 0, "max_active_batch": 0, "prefills": 0, "finished": 0}

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_dirs(cls, target_dir, drafter_dir=None, cfg: RuntimeConfig = RuntimeConfig(), *, tp_size: int = 1,
                  allow_pickle: bool = False, presharded: dict | None = None, ep_size: int = 1) -> "Engine":
        device, dtype = _resolve(cfg)
        target_dir = Path(target_dir)
        tcfg = hf.read_config(target_dir)
        dcfg = hf.read_config(drafter_dir) if drafter_dir is not None and cfg.block_size != 1 else None
        if dcfg is not None:  # config checks first: a bad pair fails before any rank or weight is touched
            validate.check_pair(tcfg, dcfg, tp_size=tp_size, block_size=cfg.block_size)
        else:
            validate.check_tp(tcfg, tp_size, "target")
        target_config(tcfg)  # an architecture the runtime lacks fails here, before any rank starts
        tp = init_tp(tp_size, device)
        if device.type == "cuda" and tp.size > 1:
            device = torch.device("cuda", torch.cuda.current_device())
        positions = cfg.max_seq_len
        drafter = (load_drafter(Path(drafter_dir), tcfg["hidden_size"], tp, device, dtype, positions, allow_pickle,
                                presharded) if dcfg is not None else None)
        capture = drafter.config.target_layer_ids if drafter is not None else ()
        target = load_target(target_dir, tp, device, dtype, positions, capture, allow_pickle, presharded, ep_size,
                             fp8_gemm=cfg.fp8_gemm, mxfp4_moe=cfg.mxfp4_moe)
        tokenizer = _load_tokenizer(target_dir)
        return cls(target, drafter, tokenizer, cfg, tp, _eos_ids(target_dir, tcfg, tokenizer))

    @classmethod
    def from_deployment(cls, engine_dir, **overrides) -> "Engine":
        """Load a dflash-build deployment directory (backend: torch)."""
        engine_dir = Path(engine_dir)
        manifest_path = engine_dir / "manifest.json"
        if not manifest_path.is_file():
            raise DFlashError(str(manifest_path), "missing", "pass a directory written by dflash-build")
        m = json.loads(manifest_path.read_text())
        if m.get("backend") != "torch":
            raise DFlashError("manifest backend", f"is {m.get('backend')!r}, the torch runtime runs 'torch' builds",
                              "serve it with TensorRT-LLM (trtllm-serve) or rebuild with --backend torch")
        runtime = {**m.get("runtime", {}), **overrides}
        cfg = RuntimeConfig(**{k: v for k, v in runtime.items() if k in RuntimeConfig.__dataclass_fields__})
        tp_size = int(m.get("tp_size", 1))
        presharded = None
        rank_file = engine_dir / "ranks" / f"rank{_launcher_rank(tp_size)}.safetensors"
        if rank_file.is_file():
            from safetensors.torch import load_file
            presharded = load_file(str(rank_file))
        drafter = engine_dir / m.get("drafter", {}).get("path", "drafter")
        return cls.from_dirs(engine_dir / m.get("target", {}).get("path", "target"),
                             drafter if drafter.is_dir() else None, cfg, tp_size=tp_size, presharded=presharded,
                             ep_size=int(m.get("ep_size", 1)))

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(),
                    on_tokens: Callable | None = None) -> Request:
        if not prompt_ids:
            raise DFlashError("prompt", "is empty", "send at least one token")
        limit = self.cfg.max_seq_len - self.block_size - 1
        if len(prompt_ids) > limit:
            raise DFlashError("prompt", f"has {len(prompt_ids)} tokens; this engine takes at most {limit}",
                              f"shorten the prompt or rebuild with a larger max_seq_len (now {self.cfg.max_seq_len})")
        vocab = self.target.config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise DFlashError("prompt", f"has token ids outside [0, {vocab})", "tokenize with the target's tokenizer")
        req = Request(list(prompt_ids), params, on_tokens)
        with self._lock:
            self._waiting.append(req)
        return req

    def cancel(self, request_id: int) -> None:
        with self._lock:
            self._cancel.add(request_id)

    def has_work(self) -> bool:
        return bool(self._waiting) or any(s is not None for s in self.slots)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] = SamplingParams()) -> list[Request]:
        plist = params if isinstance(params, list) else [params] * len(prompts)
        reqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        while not all(r.done for r in reqs):
            self.step()
        return reqs

    def metrics(self) -> dict:
        return {**self.counters, "active": sum(s is not None for s in self.slots), "waiting": len(self._waiting),
                "block_size": self.block_size, "max_batch_size": self.cfg.max_batch_size}

    # ---- the loop -------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Admit waiting requests (prefill), then one draft + verify over every active slot."""
        admitted, finished = self._control()
        if admitted:
            finished += self._prefill(admitted)
        n = max((i + 1 for i, s in enumerate(self.slots) if s is not None), default=0)
        if n:
            finished += self._decode(n)
        return finished

    @torch.inference_mode()
    def _decode(self, n: int) -> list[Request]:
        B = self.block_size
        ctx_len = max(self._start_host[i] for i in range(n) if self.slots[i] is not None)
        if self.use_graphs:  # one graph per (batch bucket, cache-length bucket, sampling path)
            nb, kv = _bucket(n, self.cfg.max_batch_size, 1), _bucket(ctx_len + B, self.cfg.max_seq_len, 256)
            self._graph(nb, kv)()
        else:
            self._step_tensors(n, ctx_len + B)
        t_host, a_host = self._t[:n].tolist(), self._a[:n].tolist()   # the one host sync per step
        self.counters["steps"] += 1
        self.counters["max_active_batch"] = max(self.counters["max_active_batch"], sum(s is not None for s in self.slots))
        finished = []
        for i in range(n):
            req = self.slots[i]
            if req is None:
                continue
            k = a_host[i]
            req.stats.acceptance_lengths.append(k + 1)
            req.stats.num_draft_tokens += B - 1
            req.stats.num_accepted_draft_tokens += k
            self._start_host[i] += k + 1
            done = self._emit(req, t_host[i][: k + 1])
            if done:
                finished.append(self._finish(req, done))
        return finished

    def _step_tensors(self, n: int, kv_len: int) -> None:
        """Draft, verify, accept and advance rows [0, n) over cache[:kv_len]; device work only (graph-safe).
        Results land in self._t (target samples) and self._a (accepted drafts)."""
        B, rows = self.block_size, slice(0, n)
        start, last = self.start[:n], self.last[:n]                     # [n]
        pos = start[:, None] + self._arange                              # [n, B] positions of the block
        draft = self.tp.broadcast(self._propose(last, pos, start, rows, kv_len)) if B > 1 else None  # [n, B-1]
        ids = torch.cat([last[:, None], draft], 1) if B > 1 else last[:, None]       # [n, B]
        h, feats = self.target(ids, pos, self.cache, rows, kv_len)
        t = self.tp.broadcast(sample(self.target.logits(h), self._sampling(n), pos + 1))  # [n, B] target samples
        a = accept(draft, t) if B > 1 else torch.zeros_like(start)     # [n]
        if B > 1:  # context K/V for the whole block; rows past the accepted prefix are masked, then overwritten
            self.drafter.append_context(feats, pos, self.draft_cache, rows)
        act = self.active[:n]
        self.last[:n] = torch.where(act, t.gather(1, a[:, None])[:, 0], last)
        self.start[:n] = torch.where(act, start + a + 1, start)
        self._t[:n], self._a[:n] = t, a

    def _graph(self, n: int, kv_len: int):
        """The CUDA graph of _step_tensors for this shape, captured on first use."""
        key = (n, kv_len, self._sampling_flags())
        if key not in self._graphs:
            saved = self.active.clone()
            self.active.zero_()  # warm-up runs must not advance any request (their cache writes land past `start`)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step_tensors(n, kv_len)
            torch.cuda.current_stream().wait_stream(side)
            self.active.copy_(saved)
            graph = torch.cuda.CUDAGraph()
            if not hasattr(self, "_pool"):
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._pool):
                self._step_tensors(n, kv_len)
            self._graphs[key] = graph
            self.counters["graphs"] = len(self._graphs)
        return self._graphs[key].replay

    def _propose(self, last, pos, start, rows, ctx_len: int) -> torch.Tensor:
        """One drafter pass over [last, mask x (B-1)] -> argmax draft tokens [n, B-1]."""
        n, B = pos.shape
        ids = torch.cat([last[:, None], torch.full((n, B - 1), self.mask_token_id, device=self.device)], 1)
        h = self.drafter(self.target.embed(ids), pos, start, self.draft_cache, rows, ctx_len)
        return self.target.logits(h[:, 1:]).argmax(-1)

    @torch.inference_mode()
    def _prefill(self, admitted: list[Request]) -> list[Request]:
        finished, group = [], []
        for req in admitted + [None]:
            if req is not None and (not group or (len(group) + 1) * max(len(r.prompt_ids) for r in group + [req]) <= _PREFILL_TOKENS):
                group.append(req)
                continue
            finished += self._prefill_group(group)
            group = [req] if req is not None else []
        return finished

    def _prefill_group(self, group: list[Request]) -> list[Request]:
        lens = [len(r.prompt_ids) for r in group]
        P = max(lens)
        ids = torch.tensor([r.prompt_ids + [0] * (P - len(r.prompt_ids)) for r in group], device=self.device)
        pos = torch.arange(P, device=self.device).expand(len(group), P)            # [m, P]
        rows = torch.tensor([r.slot for r in group], device=self.device)           # [m]
        plen = torch.tensor(lens, device=self.device)                               # [m]
        h, feats = self.target(ids, pos, self.cache, rows, None)
        last_h = h[torch.arange(len(group), device=self.device), plen - 1][:, None]  # [m, 1, hidden]
        sb = SamplingBatch.from_params([r.params for r in group], self.device)
        first = self.tp.broadcast(sample(self.target.logits(last_h), sb, plen[:, None])[:, 0])  # [m]
        if self.block_size > 1:
            self.drafter.append_context(feats, pos, self.draft_cache, rows)
        self.start[rows], self.last[rows], self.active[rows] = plen, first, True
        self.counters["prefills"] += 1
        finished = []
        for req, tok in zip(group, first.tolist()):
            self._start_host[req.slot] = len(req.prompt_ids)
            req.stats.num_prompt_tokens = len(req.prompt_ids)
            req.stats.ttft_s = time.perf_counter() - req.t_arrival
            done = self._emit(req, [tok])
            if done:
                finished.append(self._finish(req, done))
        return finished

    # ---- bookkeeping ----------------------------------------------------------------------------
    def _emit(self, req: Request, toks: list[int]) -> str | None:
        """Append committed tokens (cut at a stop token or the budget); returns a finish reason or None."""
        p, reason = req.params, None
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else self.eos_ids)
        cut = next((j for j, tok in enumerate(toks) if tok in stops), None)
        if cut is not None:
            toks, reason = toks[: cut + 1], "stop"
        room = p.max_new_tokens - len(req.output_ids)
        if len(toks) > room or (len(toks) == room and reason is None):
            toks, reason = toks[:room], "length"
        req.output_ids.extend(toks)
        if reason is None and self._start_host[req.slot] + self.block_size > self.cfg.max_seq_len:
            reason = "length"  # the KV cache row is full
        now = time.perf_counter()
        if len(req.output_ids) > len(toks):
            req.stats.decode_s = now - req.t_arrival - req.stats.ttft_s
        req.stats.num_output_tokens = len(req.output_ids)
        if req.on_tokens is not None and toks:
            req.on_tokens(req, toks)
        return reason

    def _finish(self, req: Request, reason: str) -> Request:
        req.finish_reason = reason
        if req.slot >= 0:
            self.slots[req.slot] = None
            self.active[req.slot] = False
            self.start[req.slot] = 0
            self.last[req.slot] = 0
            self._start_host[req.slot] = 0
            self._flags = None
        self.counters["finished"] += 1
        req.done_event.set()
        return req

    def _control(self) -> tuple[list[Request], list[Request]]:
        """Rank 0 decides which requests leave (cancelled) and then which enter (free slots, FIFO);
        the other ranks receive the same decision. Returns (admitted, cancelled)."""
        if self.tp.rank == 0:
            with self._lock:
                ids, self._cancel = self._cancel, set()
                cancelled = [r for r in self._waiting if r.request_id in ids]
                self._waiting = deque(r for r in self._waiting if r.request_id not in ids)
                running = [s for s in self.slots if s is not None and s.request_id in ids]
                for r in running:
                    self._finish(r, "cancelled")
                free = [i for i, s in enumerate(self.slots) if s is None]
                admitted = [self._waiting.popleft() for _ in range(min(len(free), len(self._waiting)))]
            for req, slot in zip(admitted, free):
                req.slot = slot
            if self.tp.active:
                self.tp.broadcast_object({"admit": [(r.slot, r.prompt_ids, r.params, r.request_id) for r in admitted],
                                          "cancel": [r.request_id for r in running], "stop": False})
            cancelled = [self._finish(r, "cancelled") for r in cancelled] + running
        else:
            msg = self.tp.broadcast_object(None)
            if msg["stop"]:
                raise StopIteration
            cancelled = [self._finish(s, "cancelled") for s in self.slots
                         if s is not None and s.request_id in set(msg["cancel"])]
            admitted = [Request(p, sp, request_id=rid, slot=slot) for slot, p, sp, rid in msg["admit"]]
        for req in admitted:
            self.slots[req.slot] = req
            self._set_sampling(req)
        return admitted, cancelled

    def _sampling_flags(self) -> tuple[bool, bool, bool]:
        if self._flags is None:
            self._flags = flags([s.params for s in self.slots if s is not None])
        return self._flags

    def _sampling(self, n: int) -> SamplingBatch:
        sp = self._sp
        return SamplingBatch(sp.temperature[:n], sp.top_k[:n], sp.top_p[:n], sp.seed[:n], *self._sampling_flags())

    def _set_sampling(self, req: Request) -> None:
        p, i = req.params, req.slot
        self._sp.temperature[i], self._sp.top_k[i], self._sp.top_p[i], self._sp.seed[i] = (
            p.temperature, p.top_k, p.top_p, seed_int64(p.seed))
        self._flags = None

    def follow(self, close: bool = True) -> None:
        """Ranks > 0: mirror rank 0's steps until it calls shutdown(); then leave the group unless
        ``close`` is False (another engine will use it)."""
        try:
            while True:
                self.step()
        except StopIteration:
            if close:
                self.tp.close()

    def shutdown(self, close: bool = True) -> None:
        """Rank 0: release the follower ranks (and leave the tensor-parallel group unless ``close`` is False)."""
        if self.tp.active and self.tp.rank == 0:
            self.tp.broadcast_object({"admit": [], "cancel": [], "stop": True})
            if close:
                self.tp.close()


def _bucket(x: int, cap: int, floor: int) -> int:
    """Round up to a power of two (at least ``floor``, at most ``cap``): few shapes, few CUDA graphs."""
    b = floor
    while b < x:
        b *= 2
    return min(b, cap)


def _launcher_rank(tp_size: int) -> int:
    from .distributed import launcher_rank_and_size
    return launcher_rank_and_size()[0] if tp_size > 1 else 0


def _load_tokenizer(target_dir: Path):
    """The target's tokenizer, or None for a weights-only folder (token-id requests still work)."""
    if not any((target_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(target_dir))


def _eos_ids(target_dir: Path, cfg: dict, tokenizer) -> set[int]:
    ids: set[int] = set()
    sources = [cfg.get("eos_token_id")]
    gen = target_dir / "generation_config.json"
    if gen.is_file():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    if tokenizer is not None:
        sources.append(tokenizer.eos_token_id)
    for s in sources:
        ids.update(s if isinstance(s, list) else [s] if s is not None else [])
    return ids
