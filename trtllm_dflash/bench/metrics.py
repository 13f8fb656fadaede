# SPDX-License-Identifier: Apache-2.0
"""Sweep metrics: pure functions from what a client saw (per-request timestamps and token counts) to one
level's numbers. Times are ``time.perf_counter()`` seconds in, milliseconds or tokens/second out.

Definitions (the JSONL rows and ``benchmarks/SWEEPS.md`` use exactly these):

- **concurrency C**: requests in flight. Closed loop: a finished request is replaced at once, so C stay
  in flight until the last C drain. ``effective_concurrency`` = sum of request latencies / wall time.
- **chunk**: one streamed response. DFlash commits several tokens per verify step, so a chunk may
  carry several tokens; the first chunk carries the prefill's token.
- **TTFT**: first chunk - request sent. **E2E**: final response - request sent.
- **TPOT**: (last token time - first token time) / (output tokens - the first chunk's tokens): the tokens that
  arrived after the first chunk over the time they took (1 token in the first chunk: trtllm-bench's
  (output tokens - 1); a server that coalesces a request's first tokens into one chunk delivered those at TTFT).
- **ITL per chunk**: gaps between consecutive chunks of a request (what a user sees stall).
  **ITL per token**: each gap divided by the tokens of the chunk it ends, counted once per token.
- **tok/s/user** (``tok_s_user``, the x axis): mean over requests of 1/TPOT, as trtllm-bench's "per user
  output speed".
  ``tok_s_user_e2e``: mean over requests of output tokens / E2E (trtllm-bench's "per user output
  throughput", benchmark_serving's "user throughput").
- **total tok/s**: all output tokens / wall time of the level (first send to last final response,
  warm-up excluded). **tok/s/gpu** = total tok/s / number of GPUs (tp_size). **request/s** likewise.
- **acceptance length**: tokens committed per target verify step = accepted drafts + 1 bonus (1 for AR).
  Mean is pooled over all steps of all requests; the histogram counts steps per length.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """One request as the client saw it."""

    t_sent: float
    num_prompt_tokens: int = 0
    chunk_times: list[float] = field(default_factory=list)   # arrival of each chunk that carried tokens
    chunk_tokens: list[int] = field(default_factory=list)    # tokens in each of those chunks
    t_done: float | None = None           # final response (may follow the last chunk, with no tokens)
    acceptance_lengths: list[int] = field(default_factory=list)  # per verify step, when the runtime says
    num_draft_tokens: int = 0             # Triton's total_draft_tokens
    num_accepted_draft_tokens: int = 0    # Triton's total_accepted_draft_tokens
    num_steps: int = 0                    # decode steps that committed tokens, where the server says (dflash-openai)
    finish_reason: str = ""
    error: str = ""

    def add_chunk(self, t: float, num_tokens: int) -> None:
        if num_tokens > 0:   # an empty piece (held-back text, the final stats response) is not a token
            self.chunk_times.append(t)
            self.chunk_tokens.append(num_tokens)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] - self.t_sent if self.chunk_times else None

    @property
    def e2e_s(self) -> float | None:
        end = self.t_done if self.t_done is not None else (self.chunk_times[-1] if self.chunk_times else None)
        return None if end is None else end - self.t_sent

    @property
    def tpot_s(self) -> float | None:
        """None when there is nothing to divide: one token, or all tokens in one chunk (not streamed)."""
        n, decode = self.num_output_tokens - (self.chunk_tokens[0] if self.chunk_tokens else 0), self.decode_s
        return decode / n if n > 0 and decode > 0 else None

    @property
    def decode_s(self) -> float:
        return self.chunk_times[-1] - self.chunk_times[0] if self.chunk_times else 0.0

    def itl_chunk_s(self) -> list[float]:
        return np.diff(self.chunk_times).tolist()

    def itl_token_s(self) -> list[float]:
        out: list[float] = []
        for gap, n in zip(np.diff(self.chunk_times), self.chunk_tokens[1:]):
            out += [float(gap) / n] * n
        return out


def distribution(values, scale: float = 1.0) -> dict:
    """mean and p50/p90/p99 of ``values`` x ``scale`` (None for each when there are no values)."""
    v = np.asarray([x for x in values if x is not None], dtype=np.float64) * scale
    if v.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    return {"mean": float(v.mean()), **{f"p{p}": float(np.percentile(v, p)) for p in PERCENTILES}}


def _min_mean_max(values: list[int]) -> dict:
    if not values:
        return {"mean": None, "min": None, "max": None}
    return {"mean": float(np.mean(values)), "min": int(min(values)), "max": int(max(values))}


def acceptance(records: list[RequestRecord], block_size: int | None) -> dict:
    """Acceptance length, from the best source the records have.

    ``runtime``: per-step lengths reported by the engine (exact). ``server_steps``: the mean from the accepted
    drafts and the decode steps the server counted (exact, also when an adaptive policy mixes blocks; dflash-openai).
    ``server_counters``: the mean from Triton's total_draft_tokens / total_accepted_draft_tokens (each step drafts
    block_size - 1: a policy that runs smaller blocks overstates it), the histogram from tokens per streamed chunk
    after the first. ``stream_chunks``: both from tokens per
    chunk after the first (TensorRT-LLM's benchmark_serving "avg decoded tokens per iter").
    """
    steps = [a for r in records for a in r.acceptance_lengths]
    draft = sum(r.num_draft_tokens for r in records)
    accepted = sum(r.num_accepted_draft_tokens for r in records)
    chunks = [n for r in records for n in r.chunk_tokens[1:]]
    served_steps = sum(r.num_steps for r in records)
    if steps:
        source, mean, hist_of = "runtime", float(np.mean(steps)), steps
    elif served_steps > 0:
        source, mean, hist_of = "server_steps", (accepted + served_steps) / served_steps, chunks
    elif block_size and block_size > 1 and draft > 0:
        n_steps = draft / (block_size - 1)
        source, mean, hist_of = "server_counters", (accepted + n_steps) / n_steps, chunks
    elif block_size == 1:
        source, mean, hist_of = "ar", 1.0, [1] * len(chunks)
    else:
        source, mean, hist_of = "stream_chunks", float(np.mean(chunks)) if chunks else None, chunks
    values, counts = np.unique(np.asarray(hist_of, dtype=np.int64), return_counts=True)
    return {"acceptance_length_mean": mean,
            "acceptance_histogram": {str(int(k)): int(c) for k, c in zip(values, counts)},
            "acceptance_source": source,
            "acceptance_rate": accepted / draft if draft else None,
            "tokens_per_chunk_mean": float(np.mean(chunks)) if chunks else None}


def summarize(records: list[RequestRecord], wall_s: float, num_gpus: int, block_size: int | None = None) -> dict:
    """One level's metrics (the ``metrics`` object of a JSONL row)."""
    ok = [r for r in records if not r.error and r.chunk_times]
    out_tokens = [r.num_output_tokens for r in ok]
    total = sum(out_tokens)
    decode_speed = [1.0 / r.tpot_s for r in ok if r.tpot_s is not None]
    e2e = [r.e2e_s for r in ok]
    finish: dict[str, int] = {}
    for r in records:
        key = "error" if r.error else (r.finish_reason or "unknown")
        finish[key] = finish.get(key, 0) + 1
    return {
        "num_requests": len(records),
        "num_errors": sum(bool(r.error) for r in records),
        "first_error": next((r.error for r in records if r.error), None),
        "finish_reasons": finish,
        "wall_s": wall_s,
        "num_output_tokens": total,
        "isl": _min_mean_max([r.num_prompt_tokens for r in ok]),
        "osl": _min_mean_max(out_tokens),
        "total_tok_s": total / wall_s if wall_s > 0 else None,
        "tok_s_gpu": total / wall_s / num_gpus if wall_s > 0 else None,
        "request_throughput": len(ok) / wall_s if wall_s > 0 else None,
        "tok_s_user": float(np.mean(decode_speed)) if decode_speed else None,
        "tok_s_user_e2e": float(np.mean([n / t for n, t in zip(out_tokens, e2e) if t > 0])) if ok else None,
        "effective_concurrency": sum(e2e) / wall_s if wall_s > 0 and ok else None,
        "ttft_ms": distribution([r.ttft_s for r in ok], 1e3),
        "tpot_ms": distribution([r.tpot_s for r in ok], 1e3),
        "e2e_ms": distribution(e2e, 1e3),
        "itl_chunk_ms": distribution([g for r in ok for g in r.itl_chunk_s()], 1e3),
        "itl_token_ms": distribution([g for r in ok for g in r.itl_token_s()], 1e3),
        **acceptance(ok, block_size),
    }
