# SPDX-License-Identifier: Apache-2.0
"""The two runtimes behind the serving frontends, one interface (the threading contract is drawn in
``serving/__init__.py``):

``submit(record)``   validate and queue one ``ServedRequest``; raises DFlashError (nothing queued) for bad input
``cancel(record)``   end it early: its last result has finish_reason ``cancelled``
``records()``        the records it serves now: the one map of live requests (frontends keep none)
``health()``         ``(ok, reason)``: False once the engine can no longer serve
``metrics()``        counters for /metrics: running and waiting requests, steps, batch sizes
``shutdown()``       cancel what is left, stop the threads and the runtime

Concurrent requests are batched by the runtime itself: the torch runtime by one scheduler thread that
owns ``Engine.step()``, TensorRT-LLM by its own executor. ``load_runtime`` picks one by the deployment's
backend (torch or trtllm, dflash-build --backend).
"""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import threading
import time


from ..deployment import Deployment
from ..errors import DFlashError
from .handoff import hand_over
from .launch import die_with_parent, follower_argv, stop_process, tp_env
from .engine_protocol import EngineInfo, _field, check
from .protocol import prompt_byte_limit
from .record import Result, ServedRequest, Unavailable

log = logging.getLogger(__name__)
# Steps that fail one after another before the engine is declared broken: one failure fails the requests
# of that step and the engine goes on; a failure that repeats with fresh requests is the engine's own.
MAX_FAILED_STEPS = 3


def load_runtime(deployment: Deployment, overrides: dict | None = None, engine_process: bool = True,
                 supervisor: int | None = None):
    """The runtime for the deployment's backend, loaded and ready for requests. ``overrides``: RuntimeConfig
    fields that replace the deployment's for this server (torch only). The torch runtime runs in an engine process
    of its own (engine_core.py) behind an ``EngineClient``; ``engine_process=False`` keeps it in this process (a
    scheduler thread), as before. ``supervisor``: dflash-serve's pid, for the Triton model (engine_core --supervisor)."""
    if deployment.backend == "trtllm":   # Deployment.open admits torch and trtllm only
        if overrides:
            raise DFlashError(f"--{next(iter(overrides))}", "overrides the torch runtime only",
                              "drop it, or change the deployment's llm_api_options.yaml")
        return TrtllmRuntime.from_deployment(deployment)
    if engine_process:
        from .engine_client import EngineClient
        return EngineClient.spawn(deployment, overrides=overrides or None, supervisor=supervisor)
    return TorchRuntime.from_deployment(deployment, overrides or {})


def _max_token_bytes(tokenizer) -> int:
    """An upper bound on the bytes of text one token stands for: the longest vocabulary entry in UTF-8
    (byte-level BPE writes each byte as one character, SentencePiece a space as 3-byte U+2581, byte
    fallback as <0xNN>: never fewer bytes than the text). 64 when the tokenizer does not say."""
    try:
        return max(len(token.encode("utf-8")) for token in tokenizer.get_vocab())
    except (AttributeError, TypeError, ValueError):
        return 64


def engine_info(engine) -> EngineInfo:
    """The limits a frontend checks requests against, read off a loaded engine."""
    config = getattr(getattr(engine, "target", None), "config", None)
    return EngineInfo(name="torch", max_seq_len=engine.cfg.max_seq_len, block_size=engine.block_size,
                      vocab_size=int(getattr(config, "vocab_size", 0) or 0),
                      max_token_bytes=_max_token_bytes(engine.tokenizer), pid=os.getpid())


def _usage(record: ServedRequest, request) -> dict:
    """The usage fields of a Result for an engine request so far (every update carries them)."""
    stats = request.stats
    return dict(num_prompt_tokens=record.num_prompt_tokens, num_output_tokens=len(request.output_ids),
                num_draft_tokens=stats.num_draft_tokens, num_accepted_draft_tokens=stats.num_accepted_draft_tokens,
                num_steps=len(stats.acceptance_lengths))


# ---------------------------------------------------------------------------------------------------
# torch: trtllm_dflash.runtime.engine.Engine, stepped by one scheduler thread


class TorchRuntime:
    """Rank 0 of trtllm_dflash's engine in this process; ranks 1..N-1 run under mpiexec."""

    name = "torch"

    def __init__(self, engine, followers: subprocess.Popen | None = None, threaded: bool = True):
        self.engine = engine
        self.followers = followers
        self.info = engine_info(engine)
        self.max_seq_len = engine.cfg.max_seq_len
        self.max_prompt_bytes = self.info.max_prompt_bytes
        self.detokenize = True      # results carry token ids; the reader decodes them (False: another process does)
        self.broken = ""                              # why the engine can no longer serve; "" = healthy
        # The one map of requests in the runtime: engine request id -> record (record.handle = the engine's Request)
        self._live: dict[int, ServedRequest] = {}
        self._updates: list[tuple[ServedRequest, Result]] = []   # this step's, handed over once it ends
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._failed_steps = 0
        # threaded=False: the caller steps the engine itself with run_once() (the engine process's loop)
        self._scheduler = threading.Thread(target=self._schedule, name="dflash-scheduler", daemon=True)
        if threaded:
            self._scheduler.start()

    @classmethod
    def from_deployment(cls, deployment: Deployment, overrides: dict | None = None,
                        threaded: bool = True) -> "TorchRuntime":
        from ..runtime.engine import Engine

        tp_size = deployment.tp_size
        followers = None
        if tp_size > 1:
            env = tp_env(tp_size)
            os.environ.update(env)      # rank 0 joins the group from this process
            argv = follower_argv(deployment.path, tp_size, env)
            log.info("[dflash] starting ranks 1..%d: %s", tp_size - 1, " ".join(argv))
            followers = subprocess.Popen(argv, start_new_session=True, preexec_fn=die_with_parent)
        loaded = threading.Event()
        if followers is not None:
            threading.Thread(target=_exit_if_ranks_fail, args=(followers, loaded), daemon=True).start()
        try:
            engine = Engine.from_deployment(deployment, **(overrides or {}))
        except BaseException:
            stop_process(followers)
            raise
        finally:
            loaded.set()
        if engine.tokenizer is None:
            stop_process(followers)
            raise DFlashError("target", f"{deployment.target_dir} has no tokenizer files",
                              "the Triton model takes text: add the tokenizer to the target checkpoint")
        return cls(engine, followers, threaded=threaded)

    def submit(self, record: ServedRequest) -> None:
        if self.broken:
            raise Unavailable("engine", f"is broken ({self.broken})", "restart the server")
        if self._stopping:
            raise Unavailable("server", "is shutting down", "send the request to a running server")
        prompt_ids, params = check(record, self.info, self.engine.tokenizer)
        self.enqueue(record, prompt_ids, params)

    def enqueue(self, record: ServedRequest, prompt_ids: list[int], params: dict) -> None:
        """Queue a request ``check`` passed (the engine process calls this for what a frontend checked)."""
        from ..config import SamplingParams

        record.num_prompt_tokens = len(prompt_ids)
        record.times_ns["arrival_time_ns"] = time.time_ns()
        if self.detokenize:
            record.attach_detokenizer(self.engine.tokenizer, on_stop=lambda: self.cancel(record))
        # Held while registering, so the scheduler cannot finish this request before it is known.
        with self._lock:
            try:
                request = self.engine.add_request(prompt_ids, SamplingParams(**params),
                                                  on_tokens=self._on_tokens_for(record), client=record.client)
            except DFlashError as err:   # the engine's own guard (a frontend with other limits)
                raise _field(err) from None
            record.handle = request
            self._live[request.request_id] = record
        self._wake.set()

    def cancel(self, record: ServedRequest) -> None:
        """The engine frees the slot at its next step and then sends the final result."""
        if record.handle is None:
            return
        self.engine.cancel(record.handle.request_id)
        self._wake.set()

    def records(self) -> list[ServedRequest]:
        """The records the runtime is serving now (a copy)."""
        with self._lock:
            return list(self._live.values())

    def health(self) -> tuple[bool, str]:
        if self.broken:
            return False, f"engine broken: {self.broken}"
        if self._scheduler.ident is not None and not self._scheduler.is_alive():
            return False, "the scheduler thread is not running"
        return True, "ok"

    def metrics(self) -> dict:
        m = self.engine.metrics()
        with self._lock:
            live = len(self._live)
        # running: in a slot, decoding; waiting: queued for a slot (the engine's own counts)
        return {**m, "running": m.get("active", 0), "waiting": m.get("waiting", 0), "live_requests": live,
                "failed_steps": self._failed_steps, "healthy": int(not self.broken)}

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._scheduler.ident is not None:
            self._scheduler.join(timeout=30)
        self._fail_all("the server is shutting down", finish_reason="cancelled")
        self.engine.shutdown()     # releases ranks 1..N-1 from their follow() loop
        stop_process(self.followers)

    # -- the scheduler thread --

    def _on_tokens_for(self, record: ServedRequest):
        # Per row and step: one append. Times, wake-ups and decoding happen once per step (_hand_over)
        # or on the frontend's thread.
        updates = self._updates

        def on_tokens(request, new_ids: list[int]) -> None:
            updates.append((record, Result(token_ids=list(new_ids), **_usage(record, request))))
        return on_tokens

    def _hand_over(self) -> None:
        """This step's updates to the frontends: one wake-up per frontend, not one per row."""
        updates = self._updates
        if not updates:
            return
        now = time.time_ns()
        for record, result in updates:
            if result.finished:
                result.times_ns = dict(record.times_ns)
            else:
                record.times_ns.setdefault("first_token_time_ns", now)
                record.times_ns["last_token_time_ns"] = now
        hand_over(updates[:])
        updates.clear()      # the same list object: on_tokens closures append to it

    def _schedule(self) -> None:
        while not self._stopping and not self.broken:
            if not self.run_once():
                self._wake.wait(timeout=0.05)
                self._wake.clear()

    def run_once(self) -> bool:
        """One engine step and its hand-over; False when there was nothing to step."""
        # After a failed step, step again only for live requests: requests cancelled by the failure may
        # still sit in the engine, and re-failing on them alone would count as fresh failures.
        if not self.engine.has_work() or (self._failed_steps and not self._live):
            return False
        try:
            finished = self.engine.step()
        except Exception as err:  # noqa: BLE001 - a failed step fails its requests, not the server
            self._hand_over()     # the tokens committed before the failure
            self._step_failed(err)
            return True
        self._failed_steps = 0
        for request in finished:
            self._finished(request)
        self._hand_over()
        return True

    def _finished(self, request) -> None:
        with self._lock:
            record = self._live.pop(request.request_id, None)
        request.on_tokens = None      # no cycle keeping the record (and Triton's response sender) alive
        if record is None:            # failed earlier
            return
        # Queued after the step's token updates: the final one goes out in the same hand-over.
        self._updates.append((record, Result(finished=True, finish_reason=request.finish_reason or "",
                                             **_usage(record, request))))   # times_ns: set by _hand_over

    def _step_failed(self, err: BaseException) -> None:
        """Fail the requests the step was working on (those given a slot) and take them out of the engine;
        the waiting ones stay queued. Failures that keep coming with fresh requests break the engine."""
        self._failed_steps += 1
        with self._lock:
            in_step = [(rid, rec) for rid, rec in self._live.items() if getattr(rec.handle, "slot", -1) >= 0]
            if not in_step:   # the engine does not say which requests it was stepping: all of them
                in_step = list(self._live.items())
            for rid, _ in in_step:
                self._live.pop(rid)
        log.error("[dflash] engine step failed (%d in a row), failing its %d request(s): %s: %s",
                  self._failed_steps, len(in_step), type(err).__name__, err, exc_info=err)
        for rid, record in in_step:
            self.engine.cancel(rid)
            record.emit(Result(finished=True, error=f"engine step failed: {type(err).__name__}: {err}",
                               times_ns=dict(record.times_ns)))
        if self._failed_steps >= MAX_FAILED_STEPS:
            self.broken = f"{self._failed_steps} steps failed in a row, the last with {type(err).__name__}: {err}"
            log.error("[dflash] engine broken: %s; every request fails until the server is restarted", self.broken)
            self._fail_all(f"engine broken: {self.broken}")

    def _fail_all(self, why: str, finish_reason: str = "") -> None:
        with self._lock:
            records, self._live = list(self._live.values()), {}
        for record in records:
            record.emit(Result(finished=True, finish_reason=finish_reason, times_ns=dict(record.times_ns),
                               error="" if finish_reason else why))


def _exit_if_ranks_fail(followers: subprocess.Popen, loaded: threading.Event) -> None:
    """Rank 0 waits in the rendezvous for ranks that may never come: if they die while it loads, end
    this process (Triton then reports the model as failed to load) rather than hang for the timeout."""
    rc = followers.wait()
    if not loaded.is_set():
        log.error("[dflash] ranks 1.. exited with code %s while rank 0 was loading (their output is above); "
                  "stopping this model process", rc)
        logging.shutdown()
        os._exit(3)


# ---------------------------------------------------------------------------------------------------
# trtllm: tensorrt_llm.LLM built by trtllm.llm_kwargs, streamed through its own asyncio API


class TrtllmRuntime:
    """TensorRT-LLM's ``LLM`` (PyTorch backend, DFlash one-model mode). It spawns its own TP ranks."""

    name = "trtllm"

    def __init__(self, llm, tensorrt_llm_module, max_seq_len: int):
        self.llm = llm
        self.trtllm = tensorrt_llm_module
        self.max_seq_len = max_seq_len
        # 64 bytes a token: above the longest vocabulary entry of the tokenizers we serve
        self.max_prompt_bytes = prompt_byte_limit(max_seq_len, 64) if max_seq_len else None
        # The one map of requests in the runtime: id(record) -> record (record.handle = its GenerationResult)
        self._live: dict[int, ServedRequest] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dflash-trtllm", daemon=True)
        self._thread.start()

    @classmethod
    def from_deployment(cls, deployment: Deployment) -> "TrtllmRuntime":
        # The same merge and schema check as trtllm-serve --extra_llm_api_options (trtllm.py).
        from ..trtllm import llm_kwargs

        tensorrt_llm, kwargs = llm_kwargs(deployment)
        log.info("[dflash] tensorrt_llm.LLM(**%s)", kwargs)
        llm = tensorrt_llm.LLM(**kwargs)
        return cls(llm, tensorrt_llm, int(kwargs.get("max_seq_len") or 0))

    def submit(self, record: ServedRequest) -> None:
        if self._stopping:
            raise Unavailable("server", "is shutting down", "send the request to a running server")
        names = ("max_tokens", "temperature", "top_k", "top_p", "seed", "frequency_penalty", "presence_penalty",
                 "ignore_eos")
        given = {k: getattr(record, k) for k in names if getattr(record, k) is not None}
        if record.stop:
            given["stop"] = list(record.stop)
        params = self.trtllm.SamplingParams(**given, return_perf_metrics=True)
        record.times_ns["arrival_time_ns"] = time.time_ns()
        prompt = record.prompt_ids if record.prompt_ids is not None else record.prompt
        result = self.llm.generate_async(prompt, params, streaming=True)
        with self._lock:
            record.handle = result
            self._live[id(record)] = record
        asyncio.run_coroutine_threadsafe(self._pump(record, result), self._loop)

    async def _pump(self, record: ServedRequest, result) -> None:
        times = record.times_ns
        try:
            async for out in result:
                piece = out.outputs[0]
                now = time.time_ns()
                times.setdefault("first_token_time_ns", now)
                times["last_token_time_ns"] = now
                usage = dict(num_prompt_tokens=len(getattr(out, "prompt_token_ids", None) or ()),
                             num_output_tokens=len(getattr(piece, "token_ids", None) or ()),
                             token_ids=list(getattr(piece, "token_ids_diff", None) or ()))
                record.num_prompt_tokens = usage["num_prompt_tokens"]
                if not out.finished:
                    if piece.text_diff or usage["token_ids"]:
                        record.emit(Result(text=piece.text_diff, **usage))
                    continue
                spec = getattr(getattr(piece, "request_perf_metrics", None), "speculative_decoding", None)
                record.emit(Result(text=piece.text_diff, finished=True, finish_reason=str(piece.finish_reason),
                                   stop_reason="" if piece.stop_reason is None else str(piece.stop_reason),
                                   num_draft_tokens=int(getattr(spec, "total_draft_tokens", 0)),
                                   num_accepted_draft_tokens=int(getattr(spec, "total_accepted_draft_tokens", 0)),
                                   times_ns=dict(times), **usage))
        except Exception as err:  # noqa: BLE001 - TensorRT-LLM's error goes back to the client
            log.exception("[dflash] TensorRT-LLM request failed")
            record.emit(Result(finished=True, error=f"TensorRT-LLM: {err}", times_ns=dict(times)))
        finally:
            with self._lock:
                self._live.pop(id(record), None)
            # A request TensorRT-LLM aborted without a last update still gets one.
            record.emit(Result(finished=True, finish_reason="cancelled", times_ns=dict(times)))

    def cancel(self, record: ServedRequest) -> None:
        with self._lock:
            live = id(record) in self._live
        if live:
            record.handle.abort()

    def records(self) -> list[ServedRequest]:
        """The records TensorRT-LLM is serving now (a copy)."""
        with self._lock:
            return list(self._live.values())

    def health(self) -> tuple[bool, str]:
        if not self._thread.is_alive():
            return False, "the TensorRT-LLM event loop thread is not running"
        return True, "ok"

    def metrics(self) -> dict:
        with self._lock:
            live = len(self._live)
        # TensorRT-LLM schedules by itself: every request it holds counts as running.
        return {"live_requests": live, "running": live, "waiting": 0, "healthy": 1}

    def shutdown(self) -> None:
        self._stopping = True
        with self._lock:
            results = [record.handle for record in self._live.values()]
        for result in results:
            result.abort()
        self.llm.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
