# SPDX-License-Identifier: Apache-2.0
"""The decode loop: lossless greedy and sampled output, acceptance bookkeeping, continuous batching,
stop conditions, streaming, cancellation."""
from __future__ import annotations

import pytest
import torch

from trtllm_dflash.testing import VOCAB
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.errors import DFlashError
from tests.runtime.oracle import PeriodicOracle
from trtllm_dflash.runtime.engine import Engine


def prompts(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 17, 1, 40, 9, 25, 2, 31][:n]
    return [torch.randint(2, VOCAB - 2, (k,), generator=g).tolist() for k in lengths]


def engines(pair, **kw):
    cfg = dict(max_seq_len=256, max_batch_size=4)
    return (Engine.from_dirs(pair[0], None, RuntimeConfig(block_size=1, **cfg)),
            Engine.from_dirs(pair[0], pair[1], RuntimeConfig(**cfg, **kw)))


@pytest.mark.parametrize("pair_name", ["tiny_pair", "tiny_qwen3_pair"])
def test_dflash_greedy_equals_ar_and_transformers(request, pair_name):
    from transformers import AutoModelForCausalLM
    pair = request.getfixturevalue(pair_name)
    ar, df = engines(pair)
    ps = prompts()  # 6 requests, 4 slots: requests wait, finish and free slots for the next ones
    sp = SamplingParams(max_new_tokens=48, ignore_eos=True)
    out_ar, out_df = ar.generate(ps, sp), df.generate(ps, sp)
    hf = AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32)
    for p, a, d in zip(ps, out_ar, out_df):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=48, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert a.output_ids == ref[0, len(p):].tolist()
        assert d.output_ids == a.output_ids
        assert len(d.output_ids) == 48 and d.finish_reason == "length"
    assert df.metrics()["max_active_batch"] == 4


def test_acceptance_bookkeeping_with_an_oracle_drafter(tiny_pair):
    ar, _ = engines(tiny_pair)
    ps = prompts(4)
    sp = SamplingParams(max_new_tokens=60, ignore_eos=True)
    truth = {tuple(p): r.output_ids for p, r in zip(ps, ar.generate(ps, sp))}
    PeriodicOracle.truth = truth
    eng = PeriodicOracle.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(max_seq_len=256, max_batch_size=4))
    for p, r in zip(ps, eng.generate(ps, sp)):
        assert r.output_ids == truth[tuple(p)]
        # every 5th token is wrong, so after the first step blocks commit up to 5 tokens (4 drafts + bonus)
        assert max(r.stats.acceptance_lengths) == 5 and r.stats.tau > 3.5
        assert r.stats.num_accepted_draft_tokens == sum(a - 1 for a in r.stats.acceptance_lengths)
        assert r.stats.num_draft_tokens == 7 * len(r.stats.acceptance_lengths)


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=1.3, top_p=0.8)])
def test_sampled_dflash_emits_the_same_tokens_as_sampled_ar(tiny_pair, kw):
    ar, df = engines(tiny_pair)
    ps = prompts(4)
    sps = [SamplingParams(max_new_tokens=40, ignore_eos=True, seed=s, **kw) for s in range(4)]
    out_ar, out_df = ar.generate(ps, sps), df.generate(ps, sps)
    assert [r.output_ids for r in out_df] == [r.output_ids for r in out_ar]
    assert len({tuple(r.output_ids) for r in out_ar}) == 4
    greedy = ar.generate(ps, SamplingParams(max_new_tokens=40, ignore_eos=True))
    assert [r.output_ids for r in greedy] != [r.output_ids for r in out_ar]  # sampling really sampled


@pytest.mark.parametrize("seed", [2**63, 2**64 - 1])
def test_uint64_seeds_run_greedy_and_sampled(tiny_pair, seed):
    """Triton's sampling_param_seed is UINT64: seeds >= 2**63 map one-to-one onto the int64 buffer."""
    ar, df = engines(tiny_pair)
    ps = prompts(2)
    greedy = ar.generate(ps, SamplingParams(max_new_tokens=12, ignore_eos=True))
    assert [r.output_ids for r in df.generate(ps, SamplingParams(max_new_tokens=12, ignore_eos=True, seed=seed))] \
        == [r.output_ids for r in greedy]
    sp = SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=1.0, seed=seed)
    out_ar, out_df = ar.generate(ps, sp), df.generate(ps, sp)
    assert [r.output_ids for r in out_df] == [r.output_ids for r in out_ar]
    # the high bits count: seed and seed - 2**63 (same low 63 bits) draw different tokens
    other = ar.generate(ps, SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=1.0, seed=seed - 2**63))
    assert [r.output_ids for r in other] != [r.output_ids for r in out_ar]


def test_tiny_temperatures_are_greedy_and_bad_ones_refused(tiny_pair):
    ar, _ = engines(tiny_pair)
    ps = prompts(2)
    greedy = [r.output_ids for r in ar.generate(ps, SamplingParams(max_new_tokens=16, ignore_eos=True))]
    for t in (1e-39, 1e-38, 1e-6):  # below GREEDY_TEMPERATURE: logits / t would overflow to inf/nan
        sp = SamplingParams(max_new_tokens=16, ignore_eos=True, temperature=t, seed=5)
        assert sp.temperature == 0.0
        assert [r.output_ids for r in ar.generate(ps, sp)] == greedy
    assert SamplingParams(temperature=1e-4).temperature == 1e-4  # above it: sampled as asked
    for bad in (dict(temperature=float("nan")), dict(seed=2**64), dict(seed=-(2**63) - 1)):
        with pytest.raises(DFlashError):
            SamplingParams(**bad)


def test_stop_tokens_budget_and_streaming(tiny_pair):
    _, df = engines(tiny_pair)
    p = prompts(1)[0]
    free = df.generate([p], SamplingParams(max_new_tokens=30, ignore_eos=True))[0].output_ids
    stop = free[7]
    chunks = []
    req = df.add_request(p, SamplingParams(max_new_tokens=30, stop_token_ids=(stop,), ignore_eos=True),
                         on_tokens=lambda r, toks: chunks.append(list(toks)))
    while not req.done:
        df.step()
    first = free.index(stop)
    assert req.output_ids == free[: first + 1] and req.finish_reason == "stop"
    assert sum(chunks, []) == req.output_ids
    r = df.generate([p], SamplingParams(max_new_tokens=1, ignore_eos=True))[0]
    assert r.output_ids == free[:1] and r.finish_reason == "length"
    assert df.metrics()["active"] == 0


def test_eos_from_the_target_config_stops(tiny_pair):
    ar, df = engines(tiny_pair)
    eos = VOCAB - 2  # trtllm_dflash.testing sets eos_token_id to this
    assert eos in df.eos_ids
    ps = prompts(6)
    outs = df.generate(ps, SamplingParams(max_new_tokens=200))
    for r in outs:
        assert (r.finish_reason == "stop") == (eos in r.output_ids)
        assert eos not in r.output_ids[:-1]


def test_cancel_frees_the_slot(tiny_pair):
    _, df = engines(tiny_pair, )
    ps = prompts(6)
    reqs = [df.add_request(p, SamplingParams(max_new_tokens=100, ignore_eos=True)) for p in ps]
    df.step()
    df.cancel(reqs[0].request_id)
    df.cancel(reqs[5].request_id)  # still waiting
    df.step()
    assert reqs[0].finish_reason == "cancelled" and reqs[5].finish_reason == "cancelled"
    assert reqs[4].slot == reqs[0].slot  # the freed slot went to the next waiting request
    while df.has_work():
        df.step()
    assert all(r.finish_reason == "length" for r in reqs[1:5])


def test_kv_cache_limit_finishes_with_length(tiny_pair):
    df = Engine.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(max_seq_len=64, max_batch_size=2))
    r = df.generate([prompts(1)[0]], SamplingParams(max_new_tokens=500, ignore_eos=True))[0]
    assert r.finish_reason == "length" and 3 + len(r.output_ids) <= 64


def test_bad_requests_are_refused_with_one_line(tiny_pair):
    _, df = engines(tiny_pair)
    with pytest.raises(DFlashError, match="prompt: is empty"):
        df.add_request([], SamplingParams())
    with pytest.raises(DFlashError, match="max_seq_len"):
        df.add_request([3] * 300, SamplingParams())
    with pytest.raises(DFlashError, match="outside"):
        df.add_request([VOCAB + 5], SamplingParams())
    with pytest.raises(DFlashError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(DFlashError, match="top_p"):
        SamplingParams(top_p=0.0)
    assert not df.has_work()


def test_block_size_override_and_stats(tiny_pair):
    _, df = engines(tiny_pair, block_size=4)
    r = df.generate([prompts(1)[0]], SamplingParams(max_new_tokens=20, ignore_eos=True))[0]
    assert df.block_size == 4 and r.stats.num_draft_tokens == 3 * len(r.stats.acceptance_lengths)
    assert r.stats.num_prompt_tokens == 3 and r.stats.num_output_tokens == 20 and r.stats.ttft_s > 0
    with pytest.raises(DFlashError, match="block_size"):
        Engine.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(block_size=9))


def eager_at_graph_shapes(engine: Engine) -> Engine:
    """Make an eager engine run every decode step at the padded shapes a CUDA graph replays it at
    (Runner.graph_shape), and every prefill at its padded (rows, tokens, keys) buckets with the scratch row;
    tests/gpu compares such an engine with graph replay."""
    runner, step = engine.runner, engine.runner.step_tensors
    runner.pad_shapes = True
    runner.padded_steps = []   # (rows, kv_len) of each step: what the test saw run

    def padded(n, kv_len, block):
        runner.padded_steps.append(runner.graph_shape(n, kv_len))
        step(*runner.padded_steps[-1], block)
    runner.step_tensors = padded
    return engine


@pytest.mark.parametrize("block", [None, 1])
def test_steps_padded_to_the_graph_shapes_emit_the_same_tokens(tiny_qwen3_pair, block):
    # the padding of a graph replay (idle rows, masked keys up to the KV bucket) never reaches a real row:
    # on CPU in float32, eager steps at the padded shapes == eager steps at the exact ones
    cfg = RuntimeConfig(max_seq_len=256, max_batch_size=4, block_size=block)
    exact = Engine.from_dirs(*tiny_qwen3_pair, cfg)
    padded = eager_at_graph_shapes(Engine.from_dirs(*tiny_qwen3_pair, cfg))
    assert padded.runner.graph_shape(3, 40) == (4, 256)
    ps = prompts()   # 6 requests over 4 slots: batches of 4, 3, 2 and 1 rows
    sp = [SamplingParams(max_new_tokens=32, ignore_eos=True),
          SamplingParams(max_new_tokens=32, ignore_eos=True, temperature=0.8, seed=4)] * 3
    for x, y in zip(exact.generate(ps, sp), padded.generate(ps, sp)):
        assert x.output_ids == y.output_ids
        assert x.stats.acceptance_lengths == y.stats.acceptance_lengths
    assert {kv for _, kv in padded.runner.padded_steps} == {256} and (4, 256) in padded.runner.padded_steps


@pytest.mark.parametrize("block, budget", [(None, 8192), (1, 8192), (None, 40)])
def test_prefills_padded_to_buckets_emit_the_same_tokens(tiny_qwen3_pair, block, budget):
    # padded prefill rows write only the scratch slot, padded tokens sit past each chunk's end, and the budget
    # counts padded shapes: same tokens as exact shapes, also when the budget splits prompts into chunks
    cfg = RuntimeConfig(max_seq_len=256, max_batch_size=4, block_size=block, max_num_tokens=budget)
    exact = Engine.from_dirs(*tiny_qwen3_pair, cfg)
    padded = Engine.from_dirs(*tiny_qwen3_pair, cfg)
    padded.runner.pad_shapes = True
    shapes = []
    prefill = padded.runner.prefill_tensors
    padded.runner.prefill_tensors = lambda m, T, kv: (shapes.append((m, T, kv)), prefill(m, T, kv))
    ps = prompts(8)   # lengths 1..40 over 4 slots
    sp = [SamplingParams(max_new_tokens=24, ignore_eos=True),
          SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=0.8, seed=7)] * 4
    for x, y in zip(exact.generate(ps, sp), padded.generate(ps, sp)):
        assert x.output_ids == y.output_ids
    assert all(m & (m - 1) == 0 and T & (T - 1) == 0 and T >= 16 and kv >= T for m, T, kv in shapes)
    assert any(m > 1 for m, _, _ in shapes)   # several arrivals prefilled in one forward
    if budget == 40:
        assert all(m * T <= 40 or m == 1 for m, T, _ in shapes)
        assert any(kv > T for _, T, kv in shapes)   # a continued chunk attends over the cache before it


def eager_graph_paths(engine: Engine) -> Engine:
    """Run the CUDA-graph code paths on the CPU: padded shapes, start-up 'capture' and every replay call the
    step function itself (with the state saving of a real capture), so start-up capture is checked here."""
    r = engine.runner
    r.use_graphs = r.pad_shapes = True

    def capture(key, fn):
        if key[0] == "prefill":   # what a warm-up or a real prefill staged must index inside its shape
            _, m, T, _ = key
            _, row = r._staging(m, T, host=False)
            assert (row[1] < T).all() and (row[1] >= 0).all() and (row[0] <= r.scratch).all(), key
            if not r._warm:   # start-up prefills run padded rows only: the scratch slot, never done
                assert (row[0] == r.scratch).all() and (row[1] == 0).all() and (row[3] == 0).all(), key
        if key not in r._graphs:
            r.captured_mid_run += r._warm
            saved = (r.active.clone(), r.start.clone(), r.last.clone())
            r.active.zero_()
            fn()   # the warm-up run of a capture: it must not advance any request
            for buf, old in zip((r.active, r.start, r.last), saved):
                buf.copy_(old)
            r._graphs[key] = fn
        return r._graphs[key]
    r._graph = capture
    return engine


@pytest.mark.parametrize("block", [None, 1])
def test_start_up_capture_covers_every_step_and_changes_no_token(tiny_qwen3_pair, block):
    cfg = RuntimeConfig(max_seq_len=128, max_batch_size=4, block_size=block, max_num_tokens=64)
    exact = Engine.from_dirs(*tiny_qwen3_pair, cfg)
    graphed = eager_graph_paths(Engine.from_dirs(*tiny_qwen3_pair, cfg))
    graphed._capture([graphed.block_size])
    captured = graphed.runner.num_graphs
    assert captured > 0 and ("prefill", 4, 16, 16) in graphed.runner._graphs
    ps = prompts(8)
    sp = [SamplingParams(max_new_tokens=20, ignore_eos=True),
          SamplingParams(max_new_tokens=20, ignore_eos=True, temperature=0.8, seed=7)] * 4
    for x, y in zip(exact.generate(ps, sp), graphed.generate(ps, sp)):
        assert x.output_ids == y.output_ids
    assert graphed.runner.captured_mid_run == 0 and graphed.runner.num_graphs == captured
