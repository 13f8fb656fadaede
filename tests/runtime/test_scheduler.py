# SPDX-License-Identifier: Apache-2.0
"""Chunked prefill mixed with decode (inflight batching): the same tokens whatever the token budget and
whenever requests arrive; the budget bounds each step's prompt tokens."""
from __future__ import annotations

import pytest

from tests.runtime.test_engine import prompts
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.runtime.scheduler import Scheduler
from trtllm_dflash.runtime.sequence import Sequence


def _engine(pair, **kw):
    return Engine.from_dirs(pair[0], pair[1], RuntimeConfig(max_seq_len=256, max_batch_size=4, **kw))


@pytest.mark.parametrize("block_size", [1, None])
def test_chunked_prefill_gives_the_unchunked_tokens(tiny_pair, block_size):
    ps = prompts(6)   # prompt lengths up to 40: budget 16 splits them over several steps
    sp = SamplingParams(max_new_tokens=20, ignore_eos=True, temperature=0.8, seed=3)
    whole = _engine(tiny_pair, block_size=block_size).generate(ps, sp)
    small = _engine(tiny_pair, block_size=block_size, max_num_tokens=16)
    chunked = small.generate(ps, sp)
    assert [r.output_ids for r in chunked] == [r.output_ids for r in whole]
    assert small.counters["prefills"] == 6


def test_arrivals_mid_decode_give_the_solo_tokens_and_wait_one_chunk(tiny_pair):
    """A request decoding alone, then long prompts arrive: its tokens do not change, every step still
    decodes it (the arrival costs it at most one chunk per step), and the newcomers match solo runs."""
    ps = prompts(4)
    sp = SamplingParams(max_new_tokens=30, ignore_eos=True)
    solo = [_engine(tiny_pair).generate([p], sp)[0].output_ids for p in ps]
    eng = _engine(tiny_pair, max_num_tokens=24)
    first = eng.add_request(ps[0], sp)
    for _ in range(3):
        eng.step()
    late = [eng.add_request(p, sp) for p in ps[1:]]
    before = len(first.output_ids)
    steps = 0
    while not all(r.done for r in [first, *late]):
        n = len(first.output_ids)
        eng.step()
        steps += 1
        assert first.done or len(first.output_ids) > n   # never stalled by the arrivals' prefill
        if steps > 200:
            raise AssertionError("did not finish")
    assert before < 30
    assert [first.output_ids, *[r.output_ids for r in late]] == solo


def test_budget_bounds_padded_prompt_tokens_per_step():
    s = Scheduler(max_batch_size=4, max_num_tokens=32)
    for n in (40, 10, 7):
        s.add(Sequence(list(range(1, n + 1)), SamplingParams()))
    out, _, arriving = s.schedule(lambda b: (4, "fixed"))
    assert [c[0] for c in out.chunks] == [0] and out.chunks[0][1:] == (0, 32)  # the oldest takes the budget
    for rid, seq in arriving.items():
        s.slots[seq.slot] = seq
    s.slots[0].num_prefilled = 32
    out, _, _ = s.schedule(lambda b: (4, "fixed"))
    # 8 tokens left of the first prompt: a continued prompt prefills alone (one row attending over its cache)
    assert out.chunks == [(0, 32, 40)] and out.decode_rows == 1   # and decodes in the step that completes it
    s.slots[0].num_prefilled = 40
    out, _, _ = s.schedule(lambda b: (4, "fixed"))
    # the new prompts go together, padded to the first one's chunk, within what the decoding row leaves: 2 x 10 <= 28
    assert out.chunks == [(1, 0, 10), (2, 0, 7)]
    assert out.decode_rows == 3   # slot 0 decodes; slots 1 and 2 finish their prompts and decode in this step
