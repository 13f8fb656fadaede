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


def test_the_policy_prices_a_step_at_the_rows_it_runs():
    """Slot 0's request finished, slot 1's still decodes: the step runs over 2 rows (decode_rows, where the engine
    reports its period), so the policy is asked about batch 2, not about the 1 request decoding."""
    s = Scheduler(max_batch_size=4, max_num_tokens=64)
    for _ in range(2):
        s.add(Sequence([1, 2, 3, 4, 5], SamplingParams()))
    asked = []
    out, _, arriving = s.schedule(lambda b: (asked.append(b), (4, "fixed"))[1])
    assert asked == [2] and out.decode_rows == 2   # both prompts finish and take their first decode together
    for seq in arriving.values():
        s.slots[seq.slot] = seq
        seq.num_prefilled = len(seq.prompt_ids)
    s.slots[0] = None
    asked.clear()
    out, _, _ = s.schedule(lambda b: (asked.append(b), (4, "fixed"))[1])
    assert out.decode_rows == 2 and asked == [2]


def _admit(s: Scheduler) -> list[str]:
    """One schedule() whose admissions take their slots; the admitted requests' clients, in slot order."""
    out, _, arriving = s.schedule(lambda b: (4, "fixed"))
    for seq in arriving.values():
        s.slots[seq.slot] = seq
    return [arriving[rid].client for _, _, _, rid in out.admit]


def _finish(s: Scheduler, slots) -> None:
    for i in slots:
        s.slots[i] = None


def test_admission_is_fair_between_clients_and_fifo_within_one():
    """A client that queued first with many requests does not hold every slot: a free slot goes to the waiting
    client holding the fewest, oldest request first; one client alone is served in arrival order."""
    s = Scheduler(max_batch_size=4, max_num_tokens=4096)
    flood = [Sequence([1, 2, 3], SamplingParams(), client="10.0.0.1") for _ in range(10)]
    for seq in flood:
        s.add(seq)
    late = [Sequence([4, 5], SamplingParams(), client="10.0.0.2") for _ in range(3)]
    for seq in late:
        s.add(seq)
    assert _admit(s) == ["10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.2"]
    assert [seq.slot for seq in flood[:2]] == [0, 2] and [seq.slot for seq in late[:2]] == [1, 3]
    assert s.num_waiting() == 9
    _finish(s, [1])                  # the late client's first request ends: its third takes the slot
    assert _admit(s) == ["10.0.0.2"] and late[2].slot == 1
    _finish(s, [0, 2])               # it now holds 2 and waits for nothing: the flood's next two, in order
    assert _admit(s) == ["10.0.0.1", "10.0.0.1"] and [flood[2].slot, flood[3].slot] == [0, 2]
    s.cancel(flood[5].request_id)    # a waiting request cancelled: dropped from its client's queue
    _, dropped, _ = s.schedule(lambda b: (4, "fixed"))
    assert dropped == [flood[5]] and s.num_waiting() == 5


def test_one_client_is_plain_fifo():
    s = Scheduler(max_batch_size=2, max_num_tokens=4096)
    seqs = [Sequence([1, 2], SamplingParams()) for _ in range(5)]
    for seq in seqs:
        s.add(seq)
    _admit(s)
    assert [seq.slot for seq in seqs] == [0, 1, -1, -1, -1]
    _finish(s, [1])
    _admit(s)
    assert seqs[2].slot == 1 and seqs[3].slot == -1
