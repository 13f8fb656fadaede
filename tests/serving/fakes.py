# SPDX-License-Identifier: Apache-2.0
"""Stand-ins for triton_python_backend_utils and the torch Engine, so the model logic runs without
Triton or weights (the real-server tests cover the real ones)."""
from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from trtllm_dflash.config import RequestStats


class FakeTritonError:
    INTERNAL, INVALID_ARG, CANCELLED, UNAVAILABLE = "INTERNAL", "INVALID_ARG", "CANCELLED", "UNAVAILABLE"

    def __init__(self, message, code=None):
        self.message, self.code = message, code


class FakePbUtils:
    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    TritonError = FakeTritonError

    class Tensor:
        def __init__(self, name, array):
            self._name, self._array = name, array

        def name(self):
            return self._name

        def as_numpy(self):
            return self._array

    @staticmethod
    def InferenceResponse(output_tensors=(), error=None):
        return SimpleNamespace(outputs={t.name(): t.as_numpy() for t in output_tensors}, error=error)


class FakeSender:
    def __init__(self):
        self.responses, self.final = [], threading.Event()

    def send(self, response=None, flags=0):
        self.responses.append(response)
        if flags & FakePbUtils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.final.set()

    def text(self) -> str:
        return "".join(r.outputs["text_output"][0].decode() for r in self.responses if r.error is None)


class FakeRequest:
    def __init__(self, inputs: dict, parameters: dict | None = None, request_id: str = ""):
        self._inputs = [FakePbUtils.Tensor(k, v) for k, v in inputs.items()]
        self._parameters, self._id = json.dumps(parameters or {}), request_id
        self.sender, self.cancelled = FakeSender(), False

    def inputs(self):
        return self._inputs

    def parameters(self):
        return self._parameters

    def request_id(self):
        return self._id

    def get_response_sender(self):
        return self.sender

    def is_cancelled(self):
        return self.cancelled


def triton_inputs(prompt: str, **kw) -> dict:
    out = {"text_input": np.array([prompt.encode()], dtype=np.object_)}
    for k, v in kw.items():
        if k == "streaming":
            out[k] = np.array([v])
        elif isinstance(v, bool):
            out[f"sampling_param_{k}"] = np.array([v])
        elif k == "stop":
            out["sampling_param_stop"] = np.array([s.encode() for s in v], dtype=np.object_)
        else:
            dtype = np.float32 if isinstance(v, float) else np.uint64 if k == "seed" else np.int32
            out[f"sampling_param_{k}"] = np.array([v], dtype=dtype)
    return out


class CharTokenizer:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


@dataclass(eq=False)
class FakeRequestState:
    prompt_ids: list
    params: object
    on_tokens: object
    request_id: int
    output_ids: list = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    finish_reason: str | None = None
    slot: int = -1                # >= 0 once admitted into the batch, as the real Sequence


class FakeEngine:
    """Continuous batching with the real Engine's threading contract: each step admits waiting requests
    and commits 2 tokens (1 accepted draft of 3) to every active one. Output = the prompt, repeated."""

    def __init__(self, max_batch_size=4, max_seq_len=256, step_s=0.002, fail_at_step=None, poison_seed=None):
        self.tokenizer = CharTokenizer()
        self.cfg = SimpleNamespace(max_batch_size=max_batch_size, max_seq_len=max_seq_len)
        # fail_at_step: every step from that one on raises (a broken device); poison_seed: a step raises
        # while a request with that seed is in the batch (as the real engine did for seeds >= 2**63)
        self.block_size, self.step_s, self.fail_at_step, self.poison_seed = 4, step_s, fail_at_step, poison_seed
        self.waiting, self.active, self.cancels = deque(), [], set()
        self.lock, self.ids = threading.Lock(), iter(range(10**9))
        self.counters = {"steps": 0, "max_active_batch": 0}
        self.shut = False

    def add_request(self, prompt_ids, params, on_tokens=None):
        req = FakeRequestState(list(prompt_ids), params, on_tokens, next(self.ids))
        with self.lock:
            self.waiting.append(req)
        return req

    def cancel(self, request_id):
        with self.lock:
            self.cancels.add(request_id)

    def has_work(self):
        return bool(self.waiting or self.active)

    def metrics(self):
        return {**self.counters, "active": len(self.active), "waiting": len(self.waiting)}

    def shutdown(self):
        self.shut = True

    def step(self):
        if self.counters["steps"] == self.fail_at_step:
            raise RuntimeError("device lost")
        finished = []
        with self.lock:
            for req in [r for r in self.active + list(self.waiting) if r.request_id in self.cancels]:
                (self.active if req in self.active else self.waiting).remove(req)
                req.finish_reason = "cancelled"
                finished.append(req)
            self.cancels.clear()
            while self.waiting and len(self.active) < self.cfg.max_batch_size:
                self.active.append(self.waiting.popleft())
                self.active[-1].slot = len(self.active) - 1
        if self.poison_seed is not None and any(r.params.seed == self.poison_seed for r in self.active):
            raise OverflowError("Overflow when unpacking long long")
        time.sleep(self.step_s)
        self.counters["steps"] += 1
        self.counters["max_active_batch"] = max(self.counters["max_active_batch"], len(self.active))
        for req in list(self.active):
            n = len(req.output_ids)
            toks = [req.prompt_ids[(n + j) % len(req.prompt_ids)] for j in range(2)][: req.params.max_new_tokens - n]
            req.output_ids += toks
            req.stats.num_draft_tokens += 3
            req.stats.num_accepted_draft_tokens += 1
            req.on_tokens(req, toks)
            if len(req.output_ids) >= req.params.max_new_tokens:
                req.finish_reason = "length"
                self.active.remove(req)
                finished.append(req)
        return finished


# Engine stand-ins for an engine process (python -m trtllm_dflash.serving.engine_core --engine_factory ...)
def slow_engine() -> FakeEngine:
    """50 ms steps: requests stay in flight long enough to kill the engine under them."""
    return FakeEngine(step_s=0.05)


def failing_engine() -> FakeEngine:
    """Every step fails (a lost device): three in a row and the engine is broken."""
    return FakeEngine(fail_at_step=0)
