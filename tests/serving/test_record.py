# SPDX-License-Identifier: Apache-2.0
"""ServedRequest: the one record between a frontend and a backend, read by a thread or by asyncio."""
import asyncio
import threading
import time

import pytest

from tests.serving.fakes import CharTokenizer
from trtllm_dflash.serving.record import Result, ServedRequest


def _emit_later(record, results, delay=0.01):
    def run():
        for r in results:
            time.sleep(delay)
            record.emit(r)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_results_blocking_reader_gets_every_update_then_stops():
    record = ServedRequest(prompt="x")
    t = _emit_later(record, [Result(text="a"), Result(text="b"), Result(text="c", finished=True, finish_reason="length"),
                             Result(text="late")])
    got = list(record.results(timeout=5))
    t.join()
    assert [r.text for r in got] == ["a", "b", "c"] and got[-1].finish_reason == "length"
    assert record.finished and record.get(timeout=0) is None      # nothing after the final result
    with pytest.raises(TimeoutError):
        list(ServedRequest(prompt="y").results(timeout=0.05))


def test_aresults_many_records_on_one_loop():
    records = [ServedRequest(prompt=str(i)) for i in range(20)]
    threads = [_emit_later(r, [Result(text=f"{i}-"), Result(text="end", finished=True)], delay=0.001 * i)
               for i, r in enumerate(records)]

    async def read(record):
        return "".join([r.text async for r in record.aresults()])

    async def main():
        return await asyncio.gather(*(read(r) for r in records))

    assert asyncio.run(main()) == [f"{i}-end" for i in range(20)]
    for t in threads:
        t.join()


def test_token_ids_are_decoded_on_the_reader_side_and_a_stop_string_ends_the_record():
    record = ServedRequest(prompt="x", stop=("END",))
    stopped = []
    record.attach_detokenizer(CharTokenizer(), on_stop=lambda: stopped.append(True))
    for chunk in ("ab", "cE", "ND", "zz"):
        record.emit(Result(token_ids=[ord(c) for c in chunk], num_output_tokens=2))
    got = list(record.results(timeout=1))
    assert "".join(r.text for r in got) == "abc" and [r.token_ids for r in got][0] == [97, 98]
    assert got[-1].finished and got[-1].finish_reason == "stop" and got[-1].stop_reason == "END"
    assert stopped == [True] and record.finished
    assert not record.push(Result(finished=True, finish_reason="cancelled"))   # the engine's own final: dropped


def test_updates_that_waited_together_come_as_one_batch_and_merge_in_order():
    """A reader that fell behind gets every waiting update at once (then sends one chunk for them); the final one
    ends its batch, and nothing after it is read."""
    from trtllm_dflash.serving.record import merged
    record = ServedRequest(prompt="x")
    record.attach_detokenizer(CharTokenizer(), on_stop=lambda: None)
    for i, chunk in enumerate(("ab", "c", "de")):
        record.emit(Result(token_ids=[ord(c) for c in chunk], num_output_tokens=2 * i + 2, num_draft_tokens=15 * (i + 1)))

    async def read():
        return [batch async for batch in record.abatches()]

    async def first_batch():
        async for batch in record.abatches():
            return batch

    batch = asyncio.run(first_batch())
    assert [r.text for r in batch] == ["ab", "c", "de"]
    one = merged(batch)
    assert (one.text, one.token_ids) == ("abcde", [97, 98, 99, 100, 101])
    assert (one.num_output_tokens, one.num_draft_tokens, one.finished) == (6, 45, False)   # cumulative: the last's
    record.emit(Result(token_ids=[ord("f")], num_output_tokens=7))
    record.emit(Result(finished=True, finish_reason="length", num_output_tokens=7))
    record.emit(Result(token_ids=[ord("g")]))   # after the final: never read
    rest = asyncio.run(read())
    assert len(rest) == 1 and [r.text for r in rest[0]] == ["f", ""] and rest[0][-1].finished
    assert merged(rest[0][:1]) is rest[0][0]


def test_a_reader_may_change_its_batch_without_losing_the_end():
    record = ServedRequest(prompt="x")
    record.emit(Result(text="a"))
    record.emit(Result(finished=True, finish_reason="length"))

    async def read():
        seen = []
        async for batch in record.abatches():
            seen.append([r.text for r in batch])
            batch.clear()   # what a reader does with its list is its own business
        return seen

    assert asyncio.run(asyncio.wait_for(read(), 5)) == [["a", ""]]
