# SPDX-License-Identifier: Apache-2.0
"""The sweep's Triton client (bench/endpoints.py) against a fake tritonclient stream: after a request whose stream
reports an error, the thread's next request runs on a fresh stream, so one failure is counted once (tritonclient
refuses every later request on a stream that reported an error)."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from trtllm_dflash.bench.endpoints import TritonClient
from trtllm_dflash.bench.workload import WorkItem


class FakeStreamClient:
    """A decoupled stream that fails its first request (and is unusable afterwards), then answers."""
    made = []

    def __init__(self, url):
        self.broken, self.closed, self.callback = False, False, None
        FakeStreamClient.made.append(self)

    def start_stream(self, callback):
        self.callback = callback

    def async_stream_infer(self, model, tensors, request_id, enable_empty_final_response):
        if self.broken:
            raise RuntimeError("The stream is no longer in valid state")
        if len(FakeStreamClient.made) == 1:          # the first stream breaks on its first request
            self.broken = True
            self.callback(None, RuntimeError("stream reset by peer"))
            return
        final = SimpleNamespace(bool_param=True)
        response = SimpleNamespace(id=request_id, parameters={"triton_final_response": final}, outputs=[])
        self.callback(SimpleNamespace(get_response=lambda: response), None)

    def stop_stream(self, cancel_requests=False):
        pass

    def close(self):
        self.closed = True


def _client() -> TritonClient:
    c = TritonClient.__new__(TritonClient)
    c.url, c.model, c.timeout, c.decoupled = "x", "m", 5.0, True
    c.tokenizer = SimpleNamespace(encode=lambda text: [1, 2])
    c._grpc = SimpleNamespace(InferenceServerClient=FakeStreamClient)
    c._local, c._clients, c._lock = threading.local(), [], threading.Lock()
    c._tensors = lambda text, i: []
    return c


def test_a_stream_error_fails_one_request_and_the_next_starts_a_fresh_stream():
    FakeStreamClient.made = []
    c = _client()
    first = c.send(0, WorkItem((1,), "a"))
    assert first.error == "stream reset by peer"
    second = c.send(1, WorkItem((1,), "b"))
    assert not second.error and second.t_done is not None
    assert len(FakeStreamClient.made) == 2 and FakeStreamClient.made[0].closed
    assert c._clients == [FakeStreamClient.made[1]]
    c.close()
    assert FakeStreamClient.made[1].closed


class _Out:
    def __init__(self, **values):
        import numpy as np
        self.values = {k: np.array([v], dtype=np.object_ if isinstance(v, bytes) else None) for k, v in values.items()}

    def as_numpy(self, name):
        return self.values[name]

    def get_response(self):
        final = SimpleNamespace(bool_param="finish_reason" in self.values)
        return SimpleNamespace(id=self.rid, parameters={"triton_final_response": final},
                               outputs=[SimpleNamespace(name=k) for k in self.values])


def _answering(responses):
    """A stream that answers each request with ``responses`` (dicts of outputs), in order."""
    class Stream(FakeStreamClient):
        def async_stream_infer(self, model, tensors, request_id, enable_empty_final_response):
            for values in responses:
                out = _Out(**values)
                out.rid = request_id
                self.callback(out, None)
    return Stream


def test_token_counts_come_from_the_servers_sequence_length():
    """dflash-serve says how many tokens each response carries: the sweep counts those, and tokenizes the text again
    only for a server that does not say (tokenizing generated text need not give its tokens back)."""
    FakeStreamClient.made = []
    final = dict(finish_reason=b"length", total_draft_tokens=4, total_accepted_draft_tokens=2)
    c = _client()
    c.tokenizer = SimpleNamespace(encode=lambda text: [1, 2])   # not callable: the counts must be the server's
    c._grpc = SimpleNamespace(InferenceServerClient=_answering(
        [dict(text_output=b"ab", sequence_length=3), dict(text_output=b"", sequence_length=0),
         dict(text_output=b"cd", sequence_length=2, **final)]))
    rec = c.send(0, WorkItem((1,), "p"))
    assert not rec.error and rec.chunk_tokens == [3, 2] and rec.num_output_tokens == 5
    counted = []

    def tokenize(text, add_special_tokens=False):
        counted.append(text)
        return {"input_ids": list(text)}
    c = _client()
    c.tokenizer = type("Tok", (), {"encode": staticmethod(lambda text: [1]), "__call__": staticmethod(tokenize)})()
    c._grpc = SimpleNamespace(InferenceServerClient=_answering([dict(text_output=b"ab"),
                                                                dict(text_output=b"cde", **final)]))
    rec = c.send(1, WorkItem((1,), "p"))
    assert rec.chunk_tokens == [2, 3] and counted
