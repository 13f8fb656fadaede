# SPDX-License-Identifier: Apache-2.0
"""The ``tensorrt_llm`` model's request and response tensors, without Triton: numpy arrays in,
a validated ``ServedRequest`` out; results in, a dict of output arrays out.

Names are those of TensorRT-LLM's LLM-API Triton model (``text_input``, ``sampling_param_*``,
``text_output``, ``acceptance_rate``, ...). Every user error is a ``DFlashError`` naming the input.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import DFlashError
from .record import Result, ServedRequest

__all__ = ["INPUT_NAMES", "OUTPUT_NAMES", "Result", "ServedRequest", "cancel_requested", "final_outputs",
           "parse_request", "prompt_byte_limit", "text_outputs", "check_json_value",
           "MAX_TEMPERATURE", "INPUT_TYPES"]

SAMPLING_INPUTS = ("best_of", "temperature", "top_k", "top_p", "frequency_penalty", "presence_penalty",
                   "max_tokens", "stop", "seed", "exclude_input_from_output", "return_perf_metrics", "ignore_eos")
INPUT_NAMES = ("text_input", "streaming", *(f"sampling_param_{n}" for n in SAMPLING_INPUTS),
               "return_finish_reason", "return_stop_reason", "stop")
OUTPUT_NAMES = ("text_output", "finish_reason", "stop_reason", "arrival_time_ns", "first_token_time_ns",
                "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
                "sequence_length")
# Request parameters Triton itself may attach (KServe ones); anything else is a client mistake,
# e.g. a misspelled input name in an HTTP generate body, which Triton turns into a parameter. "id": a
# generate body's request id, which Triton 2.51 both takes as the id and passes on as a parameter.
_TRITON_PARAMETERS = {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                      "binary_data_output", "headers", "id"}
# Ours: a secret the client chooses; a `stop` request must repeat it to cancel this request by its id.
CANCEL_KEY = "cancel_key"
# The client's address as dflash-serve's guards saw it, set by them on every request they forward (a client's own
# is dropped) and forwarded by Triton as a request parameter (--http/grpc-header-forward-pattern): the engine's
# admission is fair between clients (runtime/scheduler.py).
CLIENT_HEADER = "dflash-client"
# Bounds checked before anything is decoded or tokenized (a 40 MB prompt took 33 s and 5 GB to refuse,
# 100k stop strings 53 s). Stop strings: OpenAI's API takes up to 4; these leave room and stay cheap
# for the held-back text check of every streamed piece.
MAX_STOP_STRINGS = 32
MAX_STOP_BYTES = 256
# Sampling temperature: finite and at most OpenAI's API bound (platform.openai.com/docs/api-reference,
# "temperature: between 0 and 2"); far above 2 the distribution is flat and the text is noise (1e30 gave
# garbage). Both servers use this one bound.
MAX_TEMPERATURE = 2.0
# Each input's Triton datatype (config.pbtxt). Triton's HTTP front end casts a JSON number to it without
# a range check (2^32+8 became 8 as INT32), so JSON values are checked against it before they reach Triton.
INPUT_TYPES = {"text_input": "BYTES", "streaming": "BOOL", "sampling_param_best_of": "INT32",
               "sampling_param_temperature": "FP32", "sampling_param_top_k": "INT32",
               "sampling_param_top_p": "FP32", "sampling_param_frequency_penalty": "FP32",
               "sampling_param_presence_penalty": "FP32", "sampling_param_max_tokens": "INT32",
               "sampling_param_stop": "BYTES", "sampling_param_seed": "UINT64",
               "sampling_param_exclude_input_from_output": "BOOL", "sampling_param_return_perf_metrics": "BOOL",
               "sampling_param_ignore_eos": "BOOL", "return_finish_reason": "BOOL", "return_stop_reason": "BOOL",
               "stop": "BOOL"}
INT_RANGES = {"INT32": (-(1 << 31), (1 << 31) - 1), "UINT64": (0, (1 << 64) - 1)}
FP32_MAX = 3.4028234663852886e38


def prompt_byte_limit(max_prompt_tokens: int, max_token_bytes: int) -> int:
    """Longest text that can still fit: no token of the vocabulary is longer than ``max_token_bytes``, so
    a longer text has more than ``max_prompt_tokens`` tokens whatever it holds."""
    return max_prompt_tokens * max_token_bytes


def _scalar(inputs: Mapping[str, np.ndarray], name: str, kind: type):
    arr = inputs.get(name)
    if arr is None:
        return None
    if arr.size != 1:
        raise DFlashError(name, f"expected one value, got shape {list(arr.shape)}", "send a [1] tensor")
    value = arr.reshape(-1)[0]
    if kind is bool:
        if arr.dtype != np.bool_:
            raise DFlashError(name, f"expected BOOL, got {arr.dtype}", "send true or false")
        return bool(value)
    if kind is int and not np.issubdtype(arr.dtype, np.integer):
        raise DFlashError(name, f"expected an integer, got {arr.dtype}", "send an INT32 value")
    if kind is float and not np.issubdtype(arr.dtype, np.number):
        raise DFlashError(name, f"expected a number, got {arr.dtype}", "send an FP32 value")
    return kind(value)


def _text(value, name: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, (bytes, np.bytes_)):
        raise DFlashError(name, f"expected a string, got {type(value).__name__}", "send a BYTES/STRING tensor")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as err:
        raise DFlashError(name, f"is not valid UTF-8 ({err.reason} at byte {err.start})",
                          "send UTF-8 text") from None


def check_json_value(name: str, value) -> None:
    """A JSON value (scalar or nested list) sent for input ``name`` fits its Triton datatype, before Triton
    casts it: bool for BOOL, a string for BYTES, an integer in range for INT32 / UINT64, a finite number in
    range for FP32. Only the datatype: each input's own bounds (max_tokens against max_seq_len, temperature
    in [0, MAX_TEMPERATURE]) are parse_request's, on every path. Unknown names are the model's to refuse."""
    kind = INPUT_TYPES.get(name)
    if kind is None:
        return
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif kind == "BOOL" and not isinstance(v, bool):
            raise DFlashError(name, f"expected true or false, got {short_repr(v)}", "send a JSON boolean")
        elif kind == "BYTES" and not isinstance(v, str):
            raise DFlashError(name, f"expected a string, got {short_repr(v)}", "send a JSON string")
        elif kind in INT_RANGES:
            lo, hi = INT_RANGES[kind]
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise DFlashError(name, f"must be an integer in [{lo}, {hi}] ({kind}), got {short_repr(v)}",
                                  "send a JSON integer in that range")
        elif kind == "FP32":
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not -FP32_MAX <= v <= FP32_MAX:  # NaN too
                raise DFlashError(name, f"must be a finite number (FP32), got {short_repr(v)}",
                                  "send a JSON number in that range")


def short_repr(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def cancel_requested(inputs: Mapping[str, np.ndarray]) -> bool:
    """The ``stop`` input is true: this request cancels the running one with the same request id."""
    return bool(_scalar(inputs, "stop", bool))


def parse_request(inputs: Mapping[str, np.ndarray], parameters: Mapping[str, object],
                  max_seq_len: int, request_id: str = "", max_prompt_bytes: int | None = None) -> ServedRequest:
    """Validate one Triton request (input name -> array, request parameters) against the limits.
    ``max_prompt_bytes``: longer prompts are refused before they are decoded or tokenized."""
    known = _TRITON_PARAMETERS | {CANCEL_KEY, CLIENT_HEADER}
    unknown = sorted(k for k in parameters if k not in known and not k.startswith("triton_"))
    if unknown:
        raise DFlashError("parameters", f"unknown {', '.join(map(repr, unknown))}",
                          f"send only the model's inputs: {', '.join(INPUT_NAMES)}")
    extra = sorted(set(inputs) - set(INPUT_NAMES))
    if extra:
        raise DFlashError("inputs", f"unknown {', '.join(map(repr, extra))}",
                          f"send only the model's inputs: {', '.join(INPUT_NAMES)}")
    text = inputs.get("text_input")
    if text is None:
        raise DFlashError("text_input", "is missing", "send the prompt as text_input")
    if text.size != 1:
        raise DFlashError("text_input", f"expected one prompt, got shape {list(text.shape)}",
                          "send one prompt per request; concurrent requests are batched by the runtime")
    raw = text.reshape(-1)[0]
    size = len(raw) if isinstance(raw, (bytes, str)) else 0
    if max_prompt_bytes is not None and size > max_prompt_bytes:
        raise DFlashError("text_input", f"is {size} bytes, longer than any prompt this deployment takes "
                          f"({max_prompt_bytes} bytes at most, max_seq_len {max_seq_len})", "shorten the prompt")
    prompt = _text(raw, "text_input")
    if not prompt:
        raise DFlashError("text_input", "is empty", "send a non-empty prompt")
    best_of = _scalar(inputs, "sampling_param_best_of", int)
    if best_of not in (None, 1):
        raise DFlashError("sampling_param_best_of", f"is {best_of}", "only 1 is supported: leave it unset")
    max_tokens = _scalar(inputs, "sampling_param_max_tokens", int)
    if max_tokens is not None and not 1 <= max_tokens <= max_seq_len - 1:
        raise DFlashError("sampling_param_max_tokens", f"must be in [1, {max_seq_len - 1}], got {max_tokens}",
                          f"max_seq_len of this deployment is {max_seq_len}")
    temperature = _scalar(inputs, "sampling_param_temperature", float)
    if temperature is not None and not 0.0 <= temperature <= MAX_TEMPERATURE:   # also rejects NaN and inf
        raise DFlashError("sampling_param_temperature", f"must be in [0, {MAX_TEMPERATURE}], got {temperature:g}",
                          "use 0 for greedy, 1 for the model's own distribution")
    top_k = _scalar(inputs, "sampling_param_top_k", int)
    if top_k is not None and top_k < 0:
        raise DFlashError("sampling_param_top_k", f"must be >= 0, got {top_k}", "use 0 to disable top-k")
    top_p = _scalar(inputs, "sampling_param_top_p", float)
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise DFlashError("sampling_param_top_p", f"must be in (0, 1], got {top_p}", "use 1 to disable top-p")
    stop = ()
    if inputs.get("sampling_param_stop") is not None:
        stops = inputs["sampling_param_stop"].reshape(-1)
        if stops.size > MAX_STOP_STRINGS:
            raise DFlashError("sampling_param_stop", f"has {stops.size} strings", f"send at most {MAX_STOP_STRINGS}")
        if any(len(s) > MAX_STOP_BYTES for s in stops if isinstance(s, (bytes, str))):
            raise DFlashError("sampling_param_stop", f"has a string longer than {MAX_STOP_BYTES} bytes",
                              "send shorter stop strings")
        stop = tuple(_text(s, "sampling_param_stop") for s in stops)
        if not all(stop):
            raise DFlashError("sampling_param_stop", "has an empty string", "send non-empty stop strings")
    exclude = _scalar(inputs, "sampling_param_exclude_input_from_output", bool)
    _scalar(inputs, "sampling_param_return_perf_metrics", bool)   # validated only: the stats are always returned
    for flag in ("return_finish_reason", "return_stop_reason"):
        _scalar(inputs, flag, bool)
    return ServedRequest(
        prompt=prompt, streaming=bool(_scalar(inputs, "streaming", bool)), max_tokens=max_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=_scalar(inputs, "sampling_param_seed", int),
        frequency_penalty=_scalar(inputs, "sampling_param_frequency_penalty", float),
        presence_penalty=_scalar(inputs, "sampling_param_presence_penalty", float), stop=stop,
        echo=exclude is False, ignore_eos=_scalar(inputs, "sampling_param_ignore_eos", bool),
        request_id=request_id)


def text_outputs(text: str, num_tokens: int) -> dict[str, np.ndarray]:
    """A streamed (not last) response: the new text and how many generated tokens it carries."""
    return {"text_output": np.array([text.encode("utf-8")], dtype=np.object_),
            "sequence_length": np.array([num_tokens], dtype=np.int32)}


def final_outputs(text: str, result: Result, num_tokens: int) -> dict[str, np.ndarray]:
    """The last response: text (all of it, or the last piece when streaming) and its generated tokens' count, how it
    ended, DFlash stats."""
    out = text_outputs(text, num_tokens)
    out["finish_reason"] = np.array([result.finish_reason.encode()], dtype=np.object_)
    out["stop_reason"] = np.array([result.stop_reason.encode("utf-8")], dtype=np.object_)
    for name in ("arrival_time_ns", "first_token_time_ns", "last_token_time_ns"):
        out[name] = np.array([result.times_ns.get(name, 0)], dtype=np.int64)
    out["acceptance_rate"] = np.array([result.acceptance_rate], dtype=np.float32)
    out["total_accepted_draft_tokens"] = np.array([result.num_accepted_draft_tokens], dtype=np.int32)
    out["total_draft_tokens"] = np.array([result.num_draft_tokens], dtype=np.int32)
    return out
