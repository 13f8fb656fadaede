# SPDX-License-Identifier: Apache-2.0
"""bench.metrics on hand-made timestamps: every definition checked against a number worked out by hand."""
from __future__ import annotations

import pytest

from trtllm_dflash.bench.metrics import RequestRecord, acceptance, distribution, summarize


def record(t0, chunks, done=None, **kw) -> RequestRecord:
    r = RequestRecord(t_sent=t0, num_prompt_tokens=10, **kw)
    for t, n in chunks:
        r.add_chunk(t, n)
    r.t_done = done
    return r


def test_one_request_dflash_chunks():
    # sent at 0; prefill token at 0.5; then steps committing 3, 1, 4 tokens at 0.7, 0.8, 1.2; final at 1.3
    r = record(0.0, [(0.5, 1), (0.7, 3), (0.75, 0), (0.8, 1), (1.2, 4)], done=1.3)
    assert r.chunk_tokens == [1, 3, 1, 4]            # the empty piece is not a chunk
    assert r.num_output_tokens == 9
    assert r.ttft_s == 0.5 and r.e2e_s == 1.3
    assert r.tpot_s == pytest.approx(0.7 / 8)         # (1.2 - 0.5) / (9 - 1)
    assert r.itl_chunk_s() == pytest.approx([0.2, 0.1, 0.4])
    assert r.itl_token_s() == pytest.approx([0.2 / 3] * 3 + [0.1] + [0.1] * 4)


def test_tokens_coalesced_into_the_first_chunk_are_not_decode_time():
    # a frontend that fell behind sends the prefill token and 5 more at once at 1.0, then 1 token each 0.1 s:
    # the 5 arrived at TTFT, so TPOT is 0.3 s over the 3 tokens after the first chunk, not over 8
    r = record(0.0, [(1.0, 6), (1.1, 1), (1.2, 1), (1.3, 1)], done=1.3)
    assert r.tpot_s == pytest.approx(0.1)
    m = summarize([r], wall_s=1.3, num_gpus=1)
    assert m["tok_s_user"] == pytest.approx(10.0)


def test_unstreamed_request_has_no_tpot():
    r = record(0.0, [(2.0, 50)])
    assert r.tpot_s is None and r.ttft_s == 2.0 and r.e2e_s == 2.0 and r.itl_chunk_s() == []


def test_summarize_closed_loop_by_hand():
    # C = 2, 4 requests of 5 tokens each, one chunk per token every 0.1 s; each starts when one finishes.
    recs = [record(t0, [(t0 + 0.1 * (k + 1), 1) for k in range(5)], done=t0 + 0.5) for t0 in (0.0, 0.0, 0.5, 0.5)]
    for r in recs:
        r.acceptance_lengths = [1] * 4
    m = summarize(recs, wall_s=1.0, num_gpus=2, block_size=1)
    assert m["num_output_tokens"] == 20 and m["total_tok_s"] == pytest.approx(20.0)
    assert m["tok_s_gpu"] == pytest.approx(10.0) and m["request_throughput"] == pytest.approx(4.0)
    assert m["tok_s_user"] == pytest.approx(10.0)        # 4 tokens after the first in 0.4 s
    assert m["tok_s_user_e2e"] == pytest.approx(10.0)    # 5 tokens in 0.5 s
    assert m["effective_concurrency"] == pytest.approx(2.0)
    assert m["tok_s_user_e2e"] * 2 == pytest.approx(m["total_tok_s"])   # steady state: exact
    assert m["ttft_ms"]["p50"] == pytest.approx(100.0) and m["tpot_ms"]["p99"] == pytest.approx(100.0)
    assert m["itl_chunk_ms"] == m["itl_token_ms"] and m["itl_chunk_ms"]["mean"] == pytest.approx(100.0)
    assert m["isl"] == {"mean": 10.0, "min": 10, "max": 10} and m["osl"]["max"] == 5
    assert m["acceptance_length_mean"] == 1.0 and m["acceptance_histogram"] == {"1": 16}
    assert m["finish_reasons"] == {"unknown": 4} and m["num_errors"] == 0


def test_errors_are_counted_not_measured():
    good = record(0.0, [(0.1, 1), (0.2, 1)], done=0.2, finish_reason="length")
    bad = RequestRecord(t_sent=0.0, error="HTTP 400: text_input: is empty")
    m = summarize([good, bad], wall_s=0.2, num_gpus=1)
    assert m["num_errors"] == 1 and m["first_error"].startswith("HTTP 400")
    assert m["finish_reasons"] == {"length": 1, "error": 1}
    assert m["total_tok_s"] == pytest.approx(10.0) and m["request_throughput"] == pytest.approx(5.0)


def test_acceptance_sources():
    runtime = record(0, [(1, 1), (2, 3), (3, 1)], acceptance_lengths=[3, 1, 4])
    a = acceptance([runtime], block_size=8)
    assert a["acceptance_source"] == "runtime" and a["acceptance_length_mean"] == pytest.approx(8 / 3)
    assert a["acceptance_histogram"] == {"1": 1, "3": 1, "4": 1}
    # Triton counters: 2 steps x 7 drafts, 5 accepted -> (5 + 2) / 2 tokens per step; histogram from chunks
    served = record(0, [(1, 1), (2, 4), (3, 3)], num_draft_tokens=14, num_accepted_draft_tokens=5)
    a = acceptance([served], block_size=8)
    assert a["acceptance_source"] == "server_counters" and a["acceptance_length_mean"] == pytest.approx(3.5)
    assert a["acceptance_rate"] == pytest.approx(5 / 14) and a["acceptance_histogram"] == {"3": 1, "4": 1}
    a = acceptance([served], block_size=None)
    assert a["acceptance_source"] == "stream_chunks" and a["acceptance_length_mean"] == pytest.approx(3.5)
    # dflash-openai's step count: exact where an adaptive policy ran blocks 1 and 8 (2 steps drafted 7 each, 5
    # accepted, 4 block-1 steps): (5 + 6) / 6, where the counters alone would say (5 + 2) / 2
    mixed = record(0, [(1, 1), (2, 4), (3, 3)], num_draft_tokens=14, num_accepted_draft_tokens=5, num_steps=6)
    a = acceptance([mixed], block_size=8)
    assert a["acceptance_source"] == "server_steps" and a["acceptance_length_mean"] == pytest.approx(11 / 6)
    a = acceptance([record(0, [(1, 1), (2, 1), (3, 1)])], block_size=1)
    assert a["acceptance_source"] == "ar" and a["acceptance_histogram"] == {"1": 2}


def test_distribution():
    assert distribution([]) == {"mean": None, "p50": None, "p90": None, "p99": None}
    d = distribution([1.0, 2.0, 3.0, None], scale=1e3)
    assert d["mean"] == pytest.approx(2000.0) and d["p50"] == pytest.approx(2000.0)
