# SPDX-License-Identifier: Apache-2.0
"""What a frontend and the engine process say to each other, and the one check of a request's fields.

``check(record, limits, tokenizer)`` is where a request is validated for the torch runtime: prompt length,
``max_tokens`` room, sampling fields, token ids in the vocabulary. Both sides call it: the frontend before a
request leaves it (so a bad one is refused at ``submit``, naming the field, and never crosses the socket) and
the in-process runtime (``TorchRuntime.submit``); the engine process trusts what arrives and still hands the
engine's own guard error back as the request's final error rather than failing.

Messages are msgpack arrays whose first element names them. Frontend -> engine (one PUSH socket per frontend,
to the engine's PULL; ``fid`` is the frontend's id, the identity of its DEALER on the engine's ROUTER):

  ["add", fid, rid, prompt_ids, params]   params: SamplingParams fields (max_new_tokens, temperature, ...)
  ["cancel", fid, rid]                    the engine frees the slot at its next step; a final result follows
  ["ack", fid, n]                         its readers took in n more "out" messages (flow control: the engine
                                          stays at most engine_core.MAX_UNACKED steps ahead of each frontend)
  ["stats", fid, seq]                     answered by ["stats", seq, metrics, ok, reason]
  ["bye", fid]                            this frontend leaves: its requests are cancelled
  ["shutdown", fid]                       the engine's owner stops it: every request ends, the process exits 0

Engine -> frontend (the engine's ROUTER to the frontend's DEALER; the frontend's first message there is
``["hello"]``, answered with ``["ready", info]`` once the engine is loaded):

  ["ready", info]                         limits and names: see ``EngineInfo``
  ["out", rows]                           one per step and frontend: every update of that frontend's requests,
                                          each row ``[rid, token_ids, finished, finish_reason, error,
                                          num_prompt, num_output, num_draft, num_accepted]``
  ["stats", seq, metrics, ok, reason]

One message per step per frontend, whatever the batch: the wire cost of a step grows by one short row per
request, not by one message per request.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import msgpack

from ..errors import DFlashError
from .protocol import prompt_byte_limit
from .record import Result, ServedRequest

SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed", "ignore_eos")
# Row layout of an "out" message (see the module doc).
ROW_FIELDS = ("rid", "token_ids", "finished", "finish_reason", "error", "num_prompt_tokens", "num_output_tokens",
              "num_draft_tokens", "num_accepted_draft_tokens", "num_steps")


@dataclass(frozen=True)
class EngineInfo:
    """What a frontend needs of the engine to check and tokenize requests itself."""

    name: str                   # the runtime: "torch"
    max_seq_len: int
    block_size: int
    vocab_size: int
    max_token_bytes: int        # the longest vocabulary entry in UTF-8 bytes (prompt size bound)
    pid: int                    # the engine process (rank 0)

    @property
    def max_prompt_bytes(self) -> int:
        return prompt_byte_limit(self.max_seq_len, self.max_token_bytes)

    @property
    def max_prompt_tokens(self) -> int:
        return self.max_seq_len - self.block_size - 1   # the engine keeps one block of headroom


def pack(message: list) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def unpack(raw: bytes) -> list:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def info_message(info: EngineInfo) -> list:
    return ["ready", asdict(info)]


def _field(err: DFlashError) -> DFlashError:
    """An engine error about a SamplingParams field, renamed to the model input that set it."""
    name = "text_input" if err.field == "prompt" else f"sampling_param_{err.field}"
    return DFlashError(name, err.problem, err.fix)


def check(record: ServedRequest, info: EngineInfo, tokenizer=None) -> tuple[list[int], dict]:
    """(prompt token ids, SamplingParams fields) of a request, or DFlashError naming the input to fix.
    Text prompts are tokenized here as the tokenizer does by default (as TensorRT-LLM does): no chat template."""
    from ..config import SamplingParams

    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(record, name) not in (None, 0.0):
            raise DFlashError(f"sampling_param_{name}", "is not supported by the torch runtime",
                              "leave it unset, or serve a deployment built with --backend trtllm")
    if record.prompt_ids is not None:
        prompt_ids = list(record.prompt_ids)
    elif tokenizer is None:
        raise DFlashError("text_input", "is text but this side has no tokenizer", "send token ids")
    else:
        prompt_ids = tokenizer.encode(record.prompt)
    if not prompt_ids:
        raise DFlashError("text_input", "is empty", "send at least one token")
    limit = info.max_prompt_tokens
    if len(prompt_ids) > limit:
        raise DFlashError("text_input", f"prompt is {len(prompt_ids)} tokens; this deployment takes at most "
                          f"{limit} (max_seq_len {info.max_seq_len})",
                          "shorten the prompt or rebuild with a larger max_seq_len")
    if info.vocab_size and (min(prompt_ids) < 0 or max(prompt_ids) >= info.vocab_size):
        raise DFlashError("text_input", f"has token ids outside [0, {info.vocab_size})",
                          "tokenize with the target's tokenizer")
    room = info.max_seq_len - len(prompt_ids)
    if record.max_tokens is not None and record.max_tokens > room:
        raise DFlashError("sampling_param_max_tokens",
                          f"{record.max_tokens} + {len(prompt_ids)} prompt tokens exceed max_seq_len {info.max_seq_len}",
                          f"ask for at most {room}")
    max_new = record.max_tokens if record.max_tokens is not None else max(1, min(SamplingParams.max_new_tokens, room))
    params = {k: getattr(record, k) for k in SAMPLING_FIELDS if getattr(record, k) is not None}
    params["max_new_tokens"] = max_new
    try:
        SamplingParams(**params)      # its own range checks (temperature, top_p, seed, ...)
    except DFlashError as err:
        raise _field(err) from None
    return prompt_ids, params


def add_message(fid: bytes, rid: int, prompt_ids: list[int], params: dict, client: str = "") -> list:
    return ["add", fid, rid, prompt_ids, params, client]


def row(rid: int, result: Result) -> list:
    return [rid, result.token_ids, result.finished, result.finish_reason, result.error, result.num_prompt_tokens,
            result.num_output_tokens, result.num_draft_tokens, result.num_accepted_draft_tokens, result.num_steps]


def result_of(r: list) -> Result:
    """An "out" row -> the Result it stands for (times are the frontend's: it stamps them on arrival)."""
    return Result(token_ids=r[1], finished=r[2], finish_reason=r[3], error=r[4], num_prompt_tokens=r[5],
                  num_output_tokens=r[6], num_draft_tokens=r[7], num_accepted_draft_tokens=r[8], num_steps=r[9])
