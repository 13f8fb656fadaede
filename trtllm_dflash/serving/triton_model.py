# SPDX-License-Identifier: Apache-2.0
"""What ``triton_model_repo/tensorrt_llm/1/model.py`` does, importable and testable without Triton:
``triton_python_backend_utils`` is passed in (tests pass a fake).

``execute`` validates each request into a ``ServedRequest``, submits it to the runtime and returns at
once. One sender thread serves every request (no thread per request): the runtime hands it each step's
updates at once (a queue: the record's ``handoff``), it decodes them and sends the responses (decoupled: one
response per piece, then a final one with the DFlash stats), and every ``cancellation_check_period_ms`` it
asks Triton whether the clients of the running requests cancelled or went away. A monitor thread publishes
the runtime's counters as Triton custom metrics and talks to dflash-serve through files in the
directory that ``DFLASH_SERVE_CONTROL_DIR`` names (set by dflash-serve, never by a request):

  stop      dflash-serve is stopping: refuse new requests, end every running one now with an error that
            says so (the client gets its final response while the endpoints are still up), then write
  drained   nothing is running any more: tritonserver can be stopped with nothing in flight
  broken    the engine can no longer serve (its reason inside): dflash-serve restarts the server

If dflash-serve itself is gone (``DFLASH_SERVE_PID``, e.g. SIGKILL), the model drains the same way.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..deployment import Deployment
from ..errors import DFlashError
from . import procfs, protocol
from .record import Result, ServedRequest, Unavailable

log = logging.getLogger(__name__)
CONTROL_DIR_ENV = "DFLASH_SERVE_CONTROL_DIR"
SUPERVISOR_PID_ENV = "DFLASH_SERVE_PID"


# The stub's GIL hand-over period (Python's default: 5 ms). Each response_sender.send() lets the GIL go while
# Triton takes the response over, and must get it back before the next send; while another thread of this process
# works (the engine client's receiver taking in a backlog of steps) the default made every send wait out the whole
# 5 ms. `python -m trtllm_dflash.bench.triton_send_rate` (benchmarks/results/triton_send_rate_cpu.json, tritonserver
# 2.51, 2-core CPU): one sender alone 5,098 sends/s; beside a thread busy all the time 187 at 5 ms, 670 at 1 ms,
# 1,611 at 0.2 ms, 1,996 at 0.1 ms; beside one busy 10% of the time in 0.2 ms stretches, no clear difference.
STUB_SWITCH_INTERVAL_S = 1e-4


def tune_stub_interpreter() -> None:
    """For Triton's python-backend stub process only (model.py's initialize): it runs nothing but this model, so
    the process-wide setting is ours to make (the model's start-up line logs it)."""
    sys.setswitchinterval(STUB_SWITCH_INTERVAL_S)


# model.yaml's key for the deployment; repositories filled by earlier versions say engine_dir
DEPLOYMENT_KEYS = ("deployment_dir", "engine_dir")


def read_model_yaml(path: Path) -> dict:
    """``1/model.yaml``: ``deployment_dir`` and ``triton_config`` (``max_batch_size``, ``decoupled``, ...)."""
    cfg = yaml.safe_load(Path(path).read_text()) or {}
    tc = cfg.get("triton_config")
    if not isinstance(tc, dict) or not {"max_batch_size", "decoupled"} <= tc.keys():
        raise DFlashError(f"{path}: triton_config", "needs max_batch_size and decoupled", "refill with dflash-build")
    if tc["max_batch_size"] != 0:
        raise DFlashError(f"{path}: triton_config.max_batch_size", f"is {tc['max_batch_size']}",
                          "use 0: the runtime batches requests itself; Triton passes them one by one")
    where = next((cfg[k] for k in DEPLOYMENT_KEYS if cfg.get(k)), None)
    if not where:
        raise DFlashError(f"{path}: deployment_dir", "is missing", "refill with dflash-build")
    return {**cfg, "deployment_dir": where}


def auto_complete(config, model_yaml: Path):
    """Triton's auto-complete hook: transaction policy and batch size come from model.yaml."""
    tc = read_model_yaml(model_yaml)["triton_config"]
    config.set_model_transaction_policy(dict(decoupled=bool(tc["decoupled"])))
    config.set_max_batch_size(int(tc["max_batch_size"]))
    return config


class _TritonLogHandler(logging.Handler):
    """trtllm_dflash's log records (runtime and serving) into Triton's log."""

    def __init__(self, logger):
        super().__init__(logging.INFO)
        self.logger = logger

    def emit(self, record: logging.LogRecord) -> None:
        level = record.levelno
        (self.logger.log_error if level >= logging.ERROR else
         self.logger.log_warn if level >= logging.WARNING else self.logger.log_info)(self.format(record))


def _log_to_triton(pb_utils) -> None:
    root = logging.getLogger("trtllm_dflash")
    has = any(isinstance(h, _TritonLogHandler) for h in root.handlers)
    if getattr(pb_utils, "Logger", None) is not None and not has:
        root.addHandler(_TritonLogHandler(pb_utils.Logger))
        root.setLevel(logging.INFO)


class DFlashModel:
    """The ``tensorrt_llm`` model. ``runtime`` is for tests; by default the one the deployment's backend names
    is loaded (serving/runtimes.py)."""

    def __init__(self, pb_utils, version_dir: Path, model_config: dict | None = None, runtime=None):
        self.pb = pb_utils
        _log_to_triton(pb_utils)
        cfg = read_model_yaml(Path(version_dir) / "model.yaml")
        tc = cfg["triton_config"]
        self.decoupled = bool(tc["decoupled"])
        if model_config is None:     # tests: as Triton would load it
            model_config = {"name": "tensorrt_llm", "model_transaction_policy": {"decoupled": self.decoupled}}
        loaded = bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))
        if loaded != self.decoupled:
            # e.g. tritonserver --disable-auto-complete-config: model.yaml's policy never reached Triton
            raise DFlashError("triton_config.decoupled", f"is {self.decoupled} in model.yaml but Triton loaded the "
                              f"model with decoupled={loaded}", "let Triton auto-complete the config, or set "
                              "model_transaction_policy in config.pbtxt to match")
        self.period_s = float(tc.get("cancellation_check_period_ms", 100)) / 1000.0
        self.deployment = Deployment.open((Path(version_dir) / cfg["deployment_dir"]).resolve())
        pid = os.environ.get(SUPERVISOR_PID_ENV, "")
        self._supervisor = int(pid) if pid.isdigit() else None
        if runtime is None:
            from .runtimes import load_runtime
            runtime = load_runtime(self.deployment, supervisor=self._supervisor)
        self.runtime = runtime
        # The runtime keeps the one map of live records (runtime.records()); here only how many still
        # owe their client a final response (dflash-serve's "drained" waits for 0).
        self._open = 0
        self._lock = threading.Lock()
        self._updates: queue.SimpleQueue = queue.SimpleQueue()   # lists of (record, Result), one per step
        self._counts = {"draft_tokens": 0, "accepted_draft_tokens": 0}
        self._finish_counts: dict[str, int] = {}
        self._metrics = _TritonMetrics(pb_utils, model_config["name"])
        self._stop = threading.Event()
        self._finalized = False
        self.draining = ""     # why new requests are refused and running ones were ended ("" = serving)
        control = os.environ.get(CONTROL_DIR_ENV)
        self._control = Path(control) if control else None
        self._reported_broken = False
        self._monitor = threading.Thread(target=self._monitor_loop, name="dflash-monitor", daemon=True)
        self._monitor.start()
        self._sender = threading.Thread(target=self._send_loop, name="dflash-sender", daemon=True)
        self._sender.start()
        self._log(f"serving {self.deployment.path} on the {runtime.name} runtime "
                  f"(decoupled={self.decoupled}, max_seq_len={runtime.max_seq_len}, "
                  f"GIL switch interval {sys.getswitchinterval() * 1e3:g} ms)")

    # -- Triton entry points --

    def execute(self, requests) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs = {t.name(): t.as_numpy() for t in request.inputs()}
                params = json.loads(request.parameters() or "{}")
                if protocol.cancel_requested(inputs):
                    self._cancel_by_id(request.request_id(), str(params.get(protocol.CANCEL_KEY, "")), sender)
                    continue
                record = protocol.parse_request(inputs, params, self.runtime.max_seq_len, request.request_id(),
                                                getattr(self.runtime, "max_prompt_bytes", None))
                if record.streaming and not self.decoupled:
                    raise DFlashError("streaming", "needs a decoupled model",
                                      "refill the repository with decoupled_mode true, or send streaming=false")
                if self.draining:
                    raise Unavailable("server", f"is shutting down ({self.draining})",
                                      "send the request to a running server")
                record.cancel_key = str(params.get(protocol.CANCEL_KEY, ""))
                record.client = str(params.get(protocol.CLIENT_HEADER, ""))   # set by dflash-serve's guards
                record.handoff, record.frontend = self, _Call(request, sender)
                # Tokenizing and queueing happen here, as TensorRT-LLM's model calls generate_async in execute.
                self.runtime.submit(record)
                with self._lock:
                    self._open += 1
                if self.draining:       # drained while it was being queued
                    self._end(record, self.draining)
            except Unavailable as err:
                self._send_error(sender, str(err), "UNAVAILABLE")
            except DFlashError as err:
                self._send_error(sender, str(err), "INVALID_ARG")
            except Exception as err:  # noqa: BLE001 - a bug answers this request, not the whole batch
                self._log(traceback.format_exc(), error=True)
                self._send_error(sender, f"internal error: {err}", "INTERNAL")

    def finalize(self) -> None:
        self._log("finalize: stopping the runtime")
        self.runtime.shutdown()
        self._stop.set()
        # The final responses the shutdown queued go out while the model is still loaded; the wait is short
        # (a send can wait on the unloading server itself, and finalize must return within Triton's exit
        # timeout), and nothing is sent after finalize: Triton frees the requests' response senders then.
        self._sender.join(timeout=2.0)
        self._finalized = True
        self._monitor.join(timeout=30)

    # -- one sender thread for every request: the records' results -> Triton responses --

    def deliver(self, updates: list) -> None:
        """The record handoff: a runtime hands over one step's updates (any thread): one queue put."""
        self._updates.put(updates)

    def after(self, callback) -> None:
        """Run ``callback`` on the sender thread once the updates delivered before it are taken in (pushed into
        their records; sent in the same round): the engine process's flow control, engine_client.py."""
        self._updates.put(callback)

    def _send_loop(self) -> None:
        next_check = time.monotonic() + self.period_s
        while not (self._stop.is_set() and self._updates.empty()):
            try:
                item = self._updates.get(timeout=self.period_s)
            except queue.Empty:
                item = []
            # Every step queued behind this one joins it: a request then gets one response for all the steps it
            # waited through. Each send crosses the Python stub's IPC into Triton (~0.1-0.3 ms), so one response
            # per request and step capped the server at a few thousand responses/s; sending the backlog at once
            # keeps up with the engine (at no latency cost while the sender keeps up: the queue then holds one
            # step).
            touched: dict[ServedRequest, None] = {}
            callbacks = []
            while True:
                if callable(item):
                    # after(): the engine process's client asks one behind every step (its flow control
                    # acknowledges a step once taken in), so the drain goes past them, or it would never hold more
                    # than the one step
                    callbacks.append(item)
                else:
                    for record, result in item:
                        record.push(result)
                        touched[record] = None
                try:
                    item = self._updates.get_nowait()
                except queue.Empty:
                    break
            # Taken in: the steps are in their records, so the engine may go on while they are sent (as
            # dflash-openai's handoff acknowledges once its loop has dispatched them); what it makes meanwhile
            # joins the next round's responses, at most MAX_UNACKED steps (engine_core.py) queued here.
            for callback in callbacks:
                callback()
            for record in touched:
                try:
                    self._respond(record)
                except Exception:  # noqa: BLE001 - one failed response must not stop the others
                    self._log(traceback.format_exc(), error=True)
                    if not record.finished:
                        self.runtime.cancel(record)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self.period_s
                self._check_cancelled()

    def _respond(self, record: ServedRequest) -> None:
        """Send what the record has (decoded here, on the sender thread). Only this thread touches the
        Triton request after execute(), and never after its final response (Triton releases it then)."""
        call: _Call = record.frontend
        pending: list[str] = []   # streamed text that waited together goes out as one response
        made = call.sent_tokens   # generated tokens in the updates taken so far (usage is cumulative)
        while not call.done and (result := record.get(timeout=0)) is not None:
            if record.streaming and record.echo and not call.echoed:
                call.echoed = True
                self._send(call.sender, protocol.text_outputs(record.prompt or "", 0), final=False)
            made = result.num_output_tokens
            if result.finished:
                call.done = True
                self._count(result)
                # streamed text that waited with the final update rides in the final response: one send
                self._respond_final(record, result, pending if record.streaming else call.pieces, call.cancelled,
                                    call.sender)
                pending = []
                # Triton has released the request: drop our references now, not when the record is collected
                # (maybe after finalize, with the stub's shared memory gone).
                call.request = call.sender = None
                with self._lock:
                    self._open -= 1
            elif record.streaming:
                pending.append(result.text)
            else:
                call.pieces.append(result.text)
        if pending:
            self._send(call.sender, protocol.text_outputs("".join(pending), made - call.sent_tokens), final=False)
            call.sent_tokens = made

    def _check_cancelled(self) -> None:
        """Ask Triton about each running request: gRPC stream closed or HTTP connection dropped."""
        for record in self.runtime.records():
            call = record.frontend
            if isinstance(call, _Call) and not call.done and not call.cancelled and self._is_cancelled(call.request):
                call.cancelled = True
                self.runtime.cancel(record)

    def _end(self, record: ServedRequest, why: str) -> None:
        record.end_for_shutdown(why)
        self.runtime.cancel(record)

    def _respond_final(self, record: ServedRequest, result: Result, pieces: list[str], cancelled: bool,
                       sender) -> None:
        """``pieces``: the text not sent yet (streaming: what waited together with the final update)."""
        call: _Call = record.frontend
        unsent = max(0, result.num_output_tokens - call.sent_tokens)
        if (result.error or cancelled) and record.streaming and pieces:   # the client still gets what was made
            self._send(sender, protocol.text_outputs("".join(pieces), unsent), final=False)
        if result.error:
            self._send_error(sender, result.error, "UNAVAILABLE" if self.draining else "INTERNAL")
        elif cancelled:
            self._send_error(sender, "Request cancelled by client", "CANCELLED")
        else:
            text = "".join(pieces) + result.text
            if record.echo and not record.streaming:
                text = (record.prompt or "") + text
            self._send(sender, protocol.final_outputs(text, result, unsent), final=True)

    def _is_cancelled(self, request) -> bool:
        try:
            return request.is_cancelled()
        except Exception as err:  # noqa: BLE001 - one bad check must not stop the request
            self._log(f"checking for cancellation failed: {err}", error=True)
            return False

    def _send(self, sender, outputs: dict, final: bool) -> None:
        if self._finalized:
            return
        response = self.pb.InferenceResponse(output_tensors=[self.pb.Tensor(k, v) for k, v in outputs.items()])
        flags = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        try:
            sender.send(response, flags=flags)
        except Exception as err:  # noqa: BLE001 - the client is gone; the cancellation check frees the slot
            self._log(f"sending a response failed: {err}", error=True)

    def _send_error(self, sender, message: str, code: str) -> None:
        if self._finalized:
            return
        code = getattr(self.pb.TritonError, code, None)
        error = self.pb.TritonError(message) if code is None else self.pb.TritonError(message, code)
        try:
            sender.send(self.pb.InferenceResponse(error=error), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as err:  # noqa: BLE001
            self._log(f"sending an error response failed: {err}", error=True)

    def _cancel_by_id(self, request_id: str, cancel_key: str, sender) -> None:
        """The ``stop`` input: cancel the running requests that carry this request id and cancel key (a
        request sent with a ``cancel_key`` parameter can only be cancelled by a client that knows it)."""
        if not request_id:
            raise DFlashError("stop", "needs the id of the request to cancel", "send it as the request id")
        targets = [record for record in self.runtime.records()
                   if isinstance(record.frontend, _Call) and record.request_id == request_id
                   and record.cancel_key == cancel_key]
        if not targets:
            raise DFlashError("stop", f"no running request has id {request_id!r} and this cancel_key",
                              "check the request id, and send the cancel_key parameter the request was sent with")
        for record in targets:
            self.runtime.cancel(record)
        self._send(sender, protocol.final_outputs("", Result(finish_reason="cancelled"), 0), final=True)

    # -- health and metrics --

    def health(self) -> tuple[bool, str]:
        """``(ok, reason)`` of the runtime: False once its engine can no longer serve."""
        return self.runtime.health()

    def _count(self, result: Result) -> None:
        reason = "error" if result.error else result.finish_reason
        with self._lock:
            self._finish_counts[reason] = self._finish_counts.get(reason, 0) + 1
            self._counts["draft_tokens"] += result.num_draft_tokens
            self._counts["accepted_draft_tokens"] += result.num_accepted_draft_tokens

    def stats(self) -> dict:
        """Runtime counters (``running``, ``waiting``, ``steps``, ...) and this model's request counts."""
        with self._lock:
            finished = dict(self._finish_counts)
            counts = dict(self._counts)
        return {**self.runtime.metrics(), **counts, "finished": finished}

    def _monitor_loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._publish_metrics()
            try:
                self._watch()
            except Exception:  # noqa: BLE001 - the monitor must keep running
                self._log(traceback.format_exc(), error=True)

    def _watch(self) -> None:
        if not self.draining:
            if self._control is not None and (self._control / "stop").exists():
                self.drain("dflash-serve is stopping")
            elif self._supervisor is not None and not _alive(self._supervisor):
                self.drain("dflash-serve is gone")
        if self.draining and self._control is not None and not self._open and not (self._control / "drained").exists():
            (self._control / "drained").write_text(self.draining)
        ok, reason = self.health()
        if not ok and not self._reported_broken:
            self._reported_broken = True
            self._log(f"{reason}; /v2/health/ready stops answering 200 once dflash-serve restarts the server",
                      error=True)
            if self._control is not None:
                (self._control / "broken").write_text(reason)

    def drain(self, why: str) -> None:
        """Refuse new requests and end every running one now: each client gets a final response (an
        error saying why) while Triton's endpoints are still up; the engine frees the slots."""
        self.draining = why
        records = [record for record in self.runtime.records() if isinstance(record.frontend, _Call)]
        self._log(f"{why}: ending {len(records)} running request(s)")
        for record in records:
            self._end(record, why)

    def _publish_metrics(self) -> None:
        try:
            self._metrics.publish(self.stats())
        except Exception as err:  # noqa: BLE001 - metrics must never take the model down
            self._log(f"publishing metrics failed: {err}", error=True)

    def _log(self, message: str, error: bool = False) -> None:
        logger = getattr(self.pb, "Logger", None)
        if logger is None:
            (log.error if error else log.info)(message)
        else:
            (logger.log_error if error else logger.log_info)(f"[dflash] {message}")


@dataclass(eq=False)
class _Call:
    """The Triton side of one record (``record.frontend``), touched by the sender thread only."""

    request: object
    sender: object
    pieces: list[str] = field(default_factory=list)   # non-streamed text so far
    sent_tokens: int = 0                              # generated tokens the responses sent so far carried
    cancelled: bool = False
    echoed: bool = False
    done: bool = False                                # the final response was sent


def _alive(pid: int) -> bool:
    """dflash-serve (``pid``) still runs tritonserver, this process's parent. Asked of tritonserver's
    parent rather than of ``pid`` itself: a killed dflash-serve stays a zombie until its own parent reaps
    it, but tritonserver is handed to another parent the moment it dies."""
    server = procfs.stat(os.getppid())
    return server is not None and server[1] == pid


class _TritonMetrics:
    """Custom metrics on Triton's /metrics endpoint (Prometheus), named ``dflash_*``."""

    GAUGES = {"active_requests": "Requests being decoded (holding a slot of the runtime's batch)",
              "waiting_requests": "Requests queued for a slot (not decoding yet)",
              "max_active_batch": "Largest number of requests decoded together in one step",
              "engine_healthy": "1 while the runtime serves; 0 once it is broken (restart the server)"}
    COUNTERS = {"steps_total": "Draft+verify steps of the runtime",
                "draft_tokens_total": "Draft tokens proposed to the target (finished requests)",
                "accepted_draft_tokens_total": "Draft tokens the target accepted (finished requests)"}

    def __init__(self, pb_utils, model_name: str):
        self.enabled = hasattr(pb_utils, "MetricFamily")
        if not self.enabled:
            return
        fam = pb_utils.MetricFamily
        labels = {"model": model_name, "version": "1"}
        # Triton drops a family's metrics when the family object dies: keep every family referenced.
        self.families = {k: fam(name=f"dflash_{k}", description=d, kind=fam.GAUGE) for k, d in self.GAUGES.items()}
        self.families.update({k: fam(name=f"dflash_{k}", description=d, kind=fam.COUNTER)
                              for k, d in self.COUNTERS.items()})
        self.gauges = {k: self.families[k].Metric(labels=labels) for k in self.GAUGES}
        self.counters = {k: self.families[k].Metric(labels=labels) for k in self.COUNTERS}
        self.requests = fam(name="dflash_requests_total", description="Finished requests, by finish reason",
                            kind=fam.COUNTER)
        self.labels = labels
        self.by_reason: dict[str, object] = {}
        self.last: dict[str, int] = {}

    def publish(self, stats: dict) -> None:
        if not self.enabled:
            return
        self.gauges["active_requests"].set(stats.get("running", 0))
        self.gauges["waiting_requests"].set(stats.get("waiting", 0))
        self.gauges["engine_healthy"].set(stats.get("healthy", 1))
        if "max_active_batch" in stats:
            self.gauges["max_active_batch"].set(stats["max_active_batch"])
        totals = {"steps_total": stats.get("steps", 0), "draft_tokens_total": stats["draft_tokens"],
                  "accepted_draft_tokens_total": stats["accepted_draft_tokens"]}
        for key, total in totals.items():
            self._increment(self.counters[key], key, total)
        for reason, total in stats["finished"].items():
            if reason not in self.by_reason:
                self.by_reason[reason] = self.requests.Metric(labels={**self.labels, "finish_reason": reason})
            self._increment(self.by_reason[reason], f"requests/{reason}", total)

    def _increment(self, metric, key: str, total: int) -> None:
        delta = total - self.last.get(key, 0)
        if delta > 0:
            metric.increment(delta)
            self.last[key] = total

