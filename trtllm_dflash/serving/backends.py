# SPDX-License-Identifier: Apache-2.0
"""The two runtimes behind the ``tensorrt_llm`` Triton model, one interface:
``submit(GenerateRequest, on_result) -> handle``, ``cancel(handle)``, ``metrics()``, ``shutdown()``.

``on_result(Result)`` is called from a backend thread with each new piece of text and once with
``finished=True``. Concurrent requests are batched by the runtime itself: the torch runtime by a
scheduler thread that owns ``Engine.step()``, TensorRT-LLM by its own executor.
"""
from __future__ import annotations

import asyncio
import logging
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from ..errors import DFlashError
from .detokenize import TextStream
from .launch import die_with_parent, follower_argv, stop_process, tp_env
from .protocol import GenerateRequest, Result

log = logging.getLogger(__name__)
OnResult = Callable[[Result], None]


def load_backend(deployment_dir: Path, manifest: dict):
    """The backend the manifest names, loaded and ready for requests."""
    backend = manifest.get("backend")
    if backend == "torch":
        return TorchBackend.from_deployment(deployment_dir, manifest)
    if backend == "trtllm":
        return TrtllmBackend.from_deployment(deployment_dir)
    raise DFlashError("manifest.backend", f"is {backend!r}", "use torch or trtllm (rebuild with dflash-build)")


# ---------------------------------------------------------------------------------------------------
# torch: trtllm_dflash.runtime.engine.Engine, stepped by one scheduler thread


@dataclass
class _Job:
    stream: TextStream
    on_result: OnResult
    times_ns: dict = field(default_factory=dict)
    request: object = None        # the engine's Request, once add_request returned
    done: bool = False            # the final Result was sent (a stop string may end a job early)


class TorchBackend:
    """Rank 0 of trtllm_dflash's runtime in this process; ranks 1..N-1 run under mpiexec."""

    name = "torch"

    def __init__(self, engine, followers: subprocess.Popen | None = None):
        self.engine = engine
        self.followers = followers
        self.max_seq_len = engine.cfg.max_seq_len
        self.error: BaseException | None = None
        self._jobs: dict[int, _Job] = {}
        self._lock = threading.Lock()
        self._events: queue.Queue = queue.Queue()
        self._wake = threading.Event()
        self._stopping = False
        # The scheduler only steps the engine; detokenizing and sending happen on the responder, so
        # a slow client or a long decode never delays the next batched step.
        self._scheduler = threading.Thread(target=self._schedule, name="dflash-scheduler", daemon=True)
        self._responder = threading.Thread(target=self._respond, name="dflash-responder", daemon=True)
        self._scheduler.start()
        self._responder.start()

    @classmethod
    def from_deployment(cls, deployment_dir: Path, manifest: dict) -> "TorchBackend":
        from ..runtime.engine import Engine

        tp_size = int(manifest.get("tp_size", 1))
        followers = None
        if tp_size > 1:
            env = tp_env(tp_size)
            os.environ.update(env)      # rank 0 joins the group from this process
            argv = follower_argv(deployment_dir, tp_size, env)
            log.info("[dflash] starting ranks 1..%d: %s", tp_size - 1, " ".join(argv))
            followers = subprocess.Popen(argv, start_new_session=True, preexec_fn=die_with_parent)
        loaded = threading.Event()
        if followers is not None:
            threading.Thread(target=_exit_if_ranks_fail, args=(followers, loaded), daemon=True).start()
        try:
            engine = Engine.from_deployment(deployment_dir)
        except BaseException:
            stop_process(followers)
            raise
        finally:
            loaded.set()
        if engine.tokenizer is None:
            stop_process(followers)
            raise DFlashError("target", f"{deployment_dir / 'target'} has no tokenizer files",
                              "the Triton model takes text: add the tokenizer to the target checkpoint")
        return cls(engine, followers)

    def submit(self, req: GenerateRequest, on_result: OnResult) -> int:
        from ..config import SamplingParams

        if self.error is not None:
            raise DFlashError("engine", f"failed earlier ({self.error})", "restart the server")
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(req, name) not in (None, 0.0):
                raise DFlashError(f"sampling_param_{name}", "is not supported by the torch backend",
                                  "leave it unset, or serve a deployment built with --backend trtllm")
        # Raw text, tokenized as the tokenizer does by default (as TensorRT-LLM does): no chat template.
        prompt_ids = self.engine.tokenizer.encode(req.prompt)
        limit = self.max_seq_len - self.engine.block_size - 1   # the engine keeps one block of headroom
        if len(prompt_ids) > limit:
            raise DFlashError("text_input", f"prompt is {len(prompt_ids)} tokens; this deployment takes at most "
                              f"{limit} (max_seq_len {self.max_seq_len})",
                              "shorten the prompt or rebuild with a larger max_seq_len")
        room = self.max_seq_len - len(prompt_ids)
        if req.max_tokens is not None and req.max_tokens > room:
            raise DFlashError("sampling_param_max_tokens",
                              f"{req.max_tokens} + {len(prompt_ids)} prompt tokens exceed "
                              f"max_seq_len {self.max_seq_len}",
                              f"ask for at most {room}")
        max_new = req.max_tokens if req.max_tokens is not None else max(1, min(SamplingParams.max_new_tokens, room))
        names = ("temperature", "top_k", "top_p", "seed", "ignore_eos")
        given = {k: getattr(req, k) for k in names if getattr(req, k) is not None}
        try:
            params = SamplingParams(max_new_tokens=max_new, **given)
        except DFlashError as err:
            raise DFlashError(f"sampling_param_{err.field}", err.problem, err.fix) from None
        job = _Job(TextStream(self.engine.tokenizer, req.stop), on_result, {"arrival_time_ns": time.time_ns()})
        # Held while registering, so the responder cannot see this request finish before it is known.
        with self._lock:
            try:
                job.request = self.engine.add_request(prompt_ids, params, on_tokens=self._on_tokens_for(job))
            except DFlashError as err:   # e.g. a prompt longer than max_seq_len allows
                field = "text_input" if err.field == "prompt" else err.field
                raise DFlashError(field, err.problem, err.fix) from None
            self._jobs[job.request.request_id] = job
        self._wake.set()
        return job.request.request_id

    def cancel(self, handle: int) -> None:
        self.engine.cancel(handle)
        self._wake.set()

    def metrics(self) -> dict:
        with self._lock:
            live = len(self._jobs)
        return {**self.engine.metrics(), "live_requests": live}

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        self._scheduler.join(timeout=30)
        self._events.put(None)
        self._responder.join(timeout=30)
        self.engine.shutdown()     # releases ranks 1..N-1 from their follow() loop
        stop_process(self.followers)

    # -- threads --

    def _on_tokens_for(self, job: _Job):
        def on_tokens(_request, new_ids: list[int]) -> None:
            now = time.time_ns()
            job.times_ns.setdefault("first_token_time_ns", now)
            job.times_ns["last_token_time_ns"] = now
            self._events.put(("tokens", job, list(new_ids)))
        return on_tokens

    def _schedule(self) -> None:
        while not self._stopping:
            if not self.engine.has_work():
                self._wake.wait(timeout=0.05)
                self._wake.clear()
                continue
            try:
                finished = self.engine.step()
            except Exception as err:  # noqa: BLE001 - a failed step must fail its requests, not hang them
                log.exception("[dflash] engine step failed; failing all requests")
                self.error = err
                self._events.put(("error", None, err))
                return
            for request in finished:
                self._events.put(("finished", request, None))

    def _respond(self) -> None:
        while (event := self._events.get()) is not None:
            kind, obj, payload = event
            try:
                if kind == "tokens":
                    self._on_tokens(obj, payload)
                elif kind == "finished":
                    self._on_finished(obj)
                else:
                    self._fail_all(payload)
            except Exception:  # noqa: BLE001 - a callback bug must not stop the responses of others
                log.exception("[dflash] sending a response failed")

    def _on_tokens(self, job: _Job, new_ids: list[int]) -> None:
        if job.done:
            return
        piece = job.stream.push(new_ids)
        if job.stream.stopped:
            # A stop string ended the text: answer now, free the slot at the next step.
            self._finish(job, piece, "stop")
            self.cancel(job.request.request_id)
        elif piece:
            job.on_result(Result(text=piece))

    def _on_finished(self, request) -> None:
        with self._lock:
            job = self._jobs.pop(request.request_id)
        if not job.done:
            self._finish(job, job.stream.finish(), request.finish_reason)
        request.on_tokens, job.on_result = None, None   # no cycles keeping Triton's response sender alive

    def _finish(self, job: _Job, text: str, finish_reason: str) -> None:
        job.done = True
        stats = job.request.stats
        job.on_result(Result(text=text, finished=True, finish_reason=finish_reason,
                             stop_reason=job.stream.stop_reason, num_draft_tokens=stats.num_draft_tokens,
                             num_accepted_draft_tokens=stats.num_accepted_draft_tokens, times_ns=job.times_ns))

    def _fail_all(self, err: BaseException) -> None:
        with self._lock:
            jobs, self._jobs = list(self._jobs.values()), {}
        for job in jobs:
            if not job.done:
                job.done = True
                job.on_result(Result(finished=True, error=f"engine step failed: {err}"))


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
# trtllm: tensorrt_llm.LLM(**llm_api_options.yaml), streamed through its own asyncio API


def llm_kwargs(deployment_dir: Path) -> dict:
    """``llm_api_options.yaml`` as LLM kwargs. ``model`` defaults to ``<dir>/target``; relative paths that
    exist inside the deployment are made absolute (the server does not run in that directory)."""
    path = deployment_dir / "llm_api_options.yaml"
    if not path.is_file():
        raise DFlashError("llm_api_options.yaml", f"missing in {deployment_dir}", "rebuild with dflash-build")
    kwargs = yaml.safe_load(path.read_text()) or {}
    kwargs.setdefault("model", "target")

    def resolve(value):
        if isinstance(value, str) and not os.path.isabs(value) and (deployment_dir / value).exists():
            return str((deployment_dir / value).resolve())
        return value

    for key in ("model", "tokenizer"):
        if key in kwargs:
            kwargs[key] = resolve(kwargs[key])
    spec = kwargs.get("speculative_config")
    if isinstance(spec, dict):
        for key in ("speculative_model", "speculative_model_dir"):
            if key in spec:
                spec[key] = resolve(spec[key])
    return kwargs


class TrtllmBackend:
    """TensorRT-LLM's ``LLM`` (PyTorch backend, DFlash one-model mode). It spawns its own TP ranks."""

    name = "trtllm"

    def __init__(self, llm, tensorrt_llm_module, max_seq_len: int):
        self.llm = llm
        self.trtllm = tensorrt_llm_module
        self.max_seq_len = max_seq_len
        self._results: dict[int, object] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dflash-trtllm", daemon=True)
        self._thread.start()

    @classmethod
    def from_deployment(cls, deployment_dir: Path) -> "TrtllmBackend":
        try:
            import tensorrt_llm
        except ImportError as err:
            raise DFlashError("backend", f"trtllm needs TensorRT-LLM >= 1.3.0rc15, which is not importable ({err})",
                              "serve inside NGC's tritonserver:<yy.mm>-trtllm-python-py3 image, "
                              "or rebuild the deployment with --backend torch") from None
        kwargs = llm_kwargs(deployment_dir)
        log.info("[dflash] tensorrt_llm.LLM(**%s)", kwargs)
        llm = tensorrt_llm.LLM(**kwargs)
        return cls(llm, tensorrt_llm, int(kwargs.get("max_seq_len") or 0))

    def submit(self, req: GenerateRequest, on_result: OnResult) -> int:
        names = ("max_tokens", "temperature", "top_k", "top_p", "seed", "frequency_penalty", "presence_penalty",
                 "ignore_eos")
        given = {k: getattr(req, k) for k in names if getattr(req, k) is not None}
        if req.stop:
            given["stop"] = list(req.stop)
        params = self.trtllm.SamplingParams(**given, return_perf_metrics=True)
        arrival = time.time_ns()
        result = self.llm.generate_async(req.prompt, params, streaming=True)
        with self._lock:
            self._next += 1
            handle = self._next
            self._results[handle] = result
        asyncio.run_coroutine_threadsafe(self._pump(handle, result, on_result, arrival), self._loop)
        return handle

    async def _pump(self, handle: int, result, on_result: OnResult, arrival: int) -> None:
        times = {"arrival_time_ns": arrival}
        try:
            async for out in result:
                piece = out.outputs[0]
                now = time.time_ns()
                times.setdefault("first_token_time_ns", now)
                times["last_token_time_ns"] = now
                if not out.finished:
                    if piece.text_diff:
                        on_result(Result(text=piece.text_diff))
                    continue
                spec = getattr(getattr(piece, "request_perf_metrics", None), "speculative_decoding", None)
                on_result(Result(text=piece.text_diff, finished=True, finish_reason=str(piece.finish_reason),
                                 stop_reason="" if piece.stop_reason is None else str(piece.stop_reason),
                                 num_draft_tokens=int(getattr(spec, "total_draft_tokens", 0)),
                                 num_accepted_draft_tokens=int(getattr(spec, "total_accepted_draft_tokens", 0)),
                                 times_ns=times))
        except Exception as err:  # noqa: BLE001 - TensorRT-LLM's error goes back to the client
            log.exception("[dflash] TensorRT-LLM request failed")
            on_result(Result(finished=True, error=f"TensorRT-LLM: {err}"))
        finally:
            with self._lock:
                self._results.pop(handle, None)

    def cancel(self, handle: int) -> None:
        with self._lock:
            result = self._results.get(handle)
        if result is not None:
            result.abort()

    def metrics(self) -> dict:
        with self._lock:
            return {"live_requests": len(self._results)}

    def shutdown(self) -> None:
        self.llm.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
