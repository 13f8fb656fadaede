# SPDX-License-Identifier: Apache-2.0
"""Stand-ins for triton_python_backend_utils and the torch Engine, so the model logic runs without
Triton or weights (the real-server tests cover the real ones)."""
from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import numpy as np

from trtllm_dflash.testing import CharTokenizer, FakeEngine  # noqa: F401  (re-exported: the engine stand-in is the package's)


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


# Engine stand-ins for an engine process (python -m trtllm_dflash.serving.engine_core --engine_factory ...)
def slow_engine() -> FakeEngine:
    """50 ms steps: requests stay in flight long enough to kill the engine under them."""
    return FakeEngine(step_s=0.05)


def failing_engine() -> FakeEngine:
    """Every step fails (a lost device): three in a row and the engine is broken."""
    return FakeEngine(fail_at_step=0)
