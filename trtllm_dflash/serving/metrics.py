# SPDX-License-Identifier: Apache-2.0
"""Prometheus metrics of dflash-openai (``GET /metrics``, text exposition format 0.0.4, written here: no
client library needed).

Names: vLLM's, under a ``dflash:`` prefix instead of ``vllm:`` (vLLM V1's ``vllm/v1/metrics/loggers.py`` and
``vllm/v1/spec_decode/metrics.py``: ``num_requests_running``, ``time_to_first_token_seconds``,
``inter_token_latency_seconds``, ``spec_decode_num_drafts``, ``spec_decode_num_draft_tokens``,
``spec_decode_num_accepted_tokens``, ...). A vLLM dashboard works with the prefix swapped, and a Prometheus
that scrapes vLLM servers too never mixes this server's series into theirs. Ours alone: the acceptance length
histogram (tokens committed per target forward, bonus included: vLLM only gives its mean as a PromQL
expression), the block the draft policy ran last and the steps run at each block.

Request-level series are observed on the frontend's side, once per update read (``observe``), from the
cumulative counts every Result carries; engine-level ones are read from the runtime at scrape time.
"""
from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field

PREFIX = "dflash:"
# vLLM's buckets (loggers.py) for the latency histograms; acceptance length: 1..16 tokens per forward
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
FINE_ITL_BUCKETS = (0.0005, 0.001, 0.002, 0.005) + ITL_BUCKETS   # a SmolLM2 step is ~1.5-5 ms on an H100
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
ACCEPTANCE_BUCKETS = tuple(float(k) for k in range(1, 17))


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self):
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect_left(self.buckets, value)   # the first edge >= value (called per row and step: no Python loop)
        if i < len(self.buckets):
            self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for edge, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{name}_bucket{{{labels},le="{edge}"}} {running}')
        out += [f'{name}_bucket{{{labels},le="+Inf"}} {self.count}', f"{name}_sum{{{labels}}} {self.total!r}",
                f"{name}_count{{{labels}}} {self.count}"]
        return out


@dataclass
class _Seen:
    """What was already counted of one request (its Results carry cumulative counts)."""

    t_arrival: float
    t_first: float | None = None
    t_last: float | None = None
    output: int = 0
    draft: int = 0
    accepted: int = 0
    done: bool = False          # its end (finished or cancelled) was counted


class ServingMetrics:
    """Counters and histograms of the requests one frontend served. ``observe`` and ``render`` may run on
    different threads."""

    def __init__(self, model_name: str):
        self.labels = f'model_name="{_escape(model_name)}"'
        self._lock = threading.Lock()
        self.finished: dict[str, int] = {}
        self.counters = {"prompt_tokens": 0, "generation_tokens": 0, "spec_decode_num_drafts": 0,
                         "spec_decode_num_draft_tokens": 0, "spec_decode_num_accepted_tokens": 0}
        self.hist = {"time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
                     "inter_token_latency_seconds": Histogram(FINE_ITL_BUCKETS),
                     "request_time_per_output_token_seconds": Histogram(FINE_ITL_BUCKETS),
                     "e2e_request_latency_seconds": Histogram(E2E_BUCKETS),
                     "spec_decode_acceptance_length": Histogram(ACCEPTANCE_BUCKETS)}

    def start(self, record) -> None:
        """A request was accepted by the runtime (call right after ``submit``): its progress is this
        frontend's state in the record."""
        record.frontend = _Seen(time.monotonic())

    def observe(self, record, result) -> None:
        """One update of ``record`` as the client gets it."""
        seen: _Seen = record.frontend
        now = time.monotonic()
        new = max(0, result.num_output_tokens - seen.output)
        draft = max(0, result.num_draft_tokens - seen.draft)
        accepted = max(0, result.num_accepted_draft_tokens - seen.accepted)
        with self._lock:
            h = self.hist
            if new:
                if seen.t_last is None:
                    h["time_to_first_token_seconds"].observe(now - seen.t_arrival)
                    seen.t_first = now
                else:
                    h["inter_token_latency_seconds"].observe(now - seen.t_last)
                seen.t_last = now
                self.counters["generation_tokens"] += new
            if draft:
                # One update per row and step (torch runtime): one draft of `draft` tokens, `accepted` taken
                self.counters["spec_decode_num_drafts"] += 1
                self.counters["spec_decode_num_draft_tokens"] += draft
                self.counters["spec_decode_num_accepted_tokens"] += accepted
                h["spec_decode_acceptance_length"].observe(accepted + 1)
            if result.finished and not seen.done:
                seen.done = True
                reason = "error" if result.error else (result.finish_reason or "stop")
                self.finished[reason] = self.finished.get(reason, 0) + 1
                self.counters["prompt_tokens"] += result.num_prompt_tokens or record.num_prompt_tokens
                h["e2e_request_latency_seconds"].observe(now - seen.t_arrival)
                n = result.num_output_tokens
                if n > 1 and seen.t_last is not None and seen.t_first is not None:
                    h["request_time_per_output_token_seconds"].observe((seen.t_last - seen.t_first) / (n - 1))
        seen.output += new
        seen.draft += draft
        seen.accepted += accepted

    def cancelled(self, record) -> None:
        """``record``'s client went away and it was cancelled: counted as finished_reason "cancelled" (its
        final result is never read, so ``observe`` does not see it)."""
        seen = getattr(record, "frontend", None)
        with self._lock:
            if not isinstance(seen, _Seen) or seen.done:
                return
            seen.done = True
            self.finished["cancelled"] = self.finished.get("cancelled", 0) + 1

    def snapshot(self) -> dict:
        """This frontend's request-level series as plain data (what ``render`` adds from the other API servers
        of one port: ``dflash-openai --api_server_count``)."""
        with self._lock:
            return {"finished": dict(self.finished), "counters": dict(self.counters),
                    "hist": {k: {"counts": list(h.counts), "total": h.total, "count": h.count}
                             for k, h in self.hist.items()}}

    def render(self, runtime: dict, peers: list[dict] = ()) -> str:
        """The exposition text: this frontend's series plus the ``snapshot()`` of each peer frontend, and the
        runtime's ``metrics()`` (flat ints: the one engine's, not summed)."""
        lab, out = self.labels, []

        def family(name: str, kind: str, help_: str, samples: list[str]) -> None:
            out.extend([f"# HELP {PREFIX}{name} {help_}", f"# TYPE {PREFIX}{name} {kind}", *samples])

        def value(name: str, v, extra: str = "") -> str:
            return f"{PREFIX}{name}{{{lab}{extra}}} {v}"

        family("num_requests_running", "gauge", "Requests in the runtime's batch (holding a slot).",
               [value("num_requests_running", runtime.get("running", 0))])
        family("num_requests_waiting", "gauge", "Requests queued for a slot.",
               [value("num_requests_waiting", runtime.get("waiting", 0))])
        family("engine_healthy", "gauge", "1 while the runtime serves; 0 once it is broken (restart the server).",
               [value("engine_healthy", runtime.get("healthy", 1))])
        finished, counters, hist = {}, {}, {k: Histogram(h.buckets) for k, h in self.hist.items()}
        for snap in [self.snapshot(), *peers]:     # this frontend's series summed with its peers'
            for reason, n in snap["finished"].items():
                finished[reason] = finished.get(reason, 0) + n
            for key, n in snap["counters"].items():
                counters[key] = counters.get(key, 0) + n
            for key, h in snap["hist"].items():
                into = hist[key]
                into.counts = [a + b for a, b in zip(into.counts, h["counts"])]
                into.total += h["total"]
                into.count += h["count"]
        hist = {k: (h, h.lines(f"{PREFIX}{k}", lab)) for k, h in hist.items()}
        family("request_success", "counter", "Finished requests, by finish reason (stop, length, cancelled, error).",
               [value("request_success_total", n, f',finished_reason="{_escape(r)}"') for r, n in sorted(finished.items())])
        helps = {"prompt_tokens": "Prompt tokens of finished requests.",
                 "generation_tokens": "Generated tokens sent to clients.",
                 "spec_decode_num_drafts": "Drafts verified by the target (one per request and DFlash step).",
                 "spec_decode_num_draft_tokens": "Draft tokens proposed to the target.",
                 "spec_decode_num_accepted_tokens": "Draft tokens the target accepted."}
        for key, help_ in helps.items():
            family(key, "counter", help_, [value(f"{key}_total", counters[key])])
        hist_help = {"time_to_first_token_seconds": "Arrival to the first token sent.",
                     "inter_token_latency_seconds": "Time between two updates of a request (one step of the runtime: "
                                                    "with DFlash an update carries every token the step committed).",
                     "request_time_per_output_token_seconds": "Per request: first to last token over tokens - 1.",
                     "e2e_request_latency_seconds": "Arrival to the final response.",
                     "spec_decode_acceptance_length": "Tokens committed per draft + verify step (accepted + 1 bonus)."}
        for key, (_, lines) in hist.items():
            family(key, "histogram", hist_help[key], lines)
        if "last_block" in runtime:
            family("spec_decode_block", "gauge", "The block (1 anchor + drafts) the draft policy ran last "
                   "(1 = autoregressive).", [value("spec_decode_block", runtime["last_block"])])
        blocks = sorted((int(k.rsplit("_", 1)[1]), v) for k, v in runtime.items() if k.startswith("steps_block_"))
        if blocks:
            family("spec_decode_steps_by_block", "counter", "Runtime steps run at each block.",
                   [value("spec_decode_steps_by_block_total", v, f',block="{b}"') for b, v in blocks])
        if "steps" in runtime:
            family("engine_steps", "counter", "Decode steps of the runtime.", [value("engine_steps_total",
                                                                                  runtime["steps"])])
        return "\n".join(out) + "\n"


def _escape(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse(text: str) -> dict[tuple[str, tuple], float]:
    """The samples of an exposition text: ``{(name, ((label, value), ...)): value}`` (tests, benchmarks)."""
    import re

    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        if m is None:
            raise ValueError(f"not a Prometheus sample line: {line!r}")
        labels = tuple(sorted(label_re.findall(m.group(2) or "")))
        value = float(m.group(3))
        if math.isnan(value):
            raise ValueError(f"NaN in {line!r}")
        out[(m.group(1), labels)] = value
    return out
