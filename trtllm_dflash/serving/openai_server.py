# SPDX-License-Identifier: Apache-2.0
"""dflash-openai: OpenAI-compatible endpoints for a deployment directory (``/v1/models``, ``/v1/completions``,
``/v1/chat/completions``, server-sent events), the API trtllm-serve speaks, for OpenAI SDKs, curl and aiperf.

Design: an ASGI app (FastAPI on uvicorn) speaking to the runtime through the one request record
(``ServedRequest``, serving/record.py) that Triton's model uses too; the torch runtime runs in an engine process
of its own (engine_core.py, reached through engine_client.py), so HTTP handling, SSE framing and detokenizing
here never hold the interpreter lock of the loop that feeds the device. Not a frontend over the
running Triton server: that would add a second HTTP hop and a second (de)tokenization per request, and Triton's
generate API returns text without token ids, so usage could not be exact. Not Triton's own OpenAI frontend:
it is source in the Triton server repository (python/openai), shipped in NGC containers, not in any wheel that
pip installs, and the PyPI ``tritonserver`` wheel (the in-process API) brings no python backend to run our model.

Chat requests are templated with the target's own chat template (``tokenizer.apply_chat_template``, as
``dflash-generate`` does) and sent as token ids. Every response carries ``usage`` and a ``dflash`` extension
(draft tokens, accepted draft tokens, acceptance rate). Errors are OpenAI-shaped
(``{"error": {"message", "type", "param", "code"}}``): 400 naming the field for a bad request, 404 for an
unknown model, 413 for a body over the limit, 503 when the engine cannot serve; the server keeps serving.

Resources a client can hold: a body of ``MAX_BODY_BYTES``; a prompt is refused by its size before it is
tokenized (``max_prompt_bytes``: max_seq_len x the longest vocabulary entry in UTF-8 bytes, so a longer text
cannot fit whatever it holds), and at most ``tokenize_workers`` prompts are templated/tokenized at once; a
client that goes away (streaming or not) has its request cancelled at once. SIGTERM drains: no new
requests; every client has its final response within ``--drain_timeout_s``: running requests may finish
until shortly before it, then each gets a final error (an SSE error event and ``[DONE]``, or a 503 body);
the process exits 0.
"""

import argparse
import asyncio
import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path

from ..bench.helpformat import HelpFormatter
from ..deployment import Deployment
from ..errors import DFlashError
from .handoff import LoopHandoff
from .metrics import ServingMetrics
from .protocol import MAX_TEMPERATURE
from .openai_limits import check_message_count, max_messages, reject_unsupported, tokens_per_message
from .record import Result, ServedRequest, Unavailable, merged

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 4 << 20          # a prompt far above any max_seq_len we build fits in 4 MiB of JSON
MAX_STOP = 16
# Accepted and ignored: they change nothing we would compute differently.
IGNORED = {"user", "logit_bias", "stream_options", "frequency_penalty", "presence_penalty", "metadata", "store",
           "service_tier", "parallel_tool_calls", "best_of"}


class BadRequest(Exception):
    def __init__(self, status: int, param: str | None, message: str, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.message, self.kind, self.code = status, param, message, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# ---- request fields -> ServedRequest ------------------------------------------------------------------------
def _number(body: dict, name: str, lo: float, hi: float, *, integer: bool = False, default=None):
    value = body.get(name, default)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise BadRequest(400, name, f"{name} must be {kind} in [{lo}, {hi}], got {value!r}")
    return value


def sampling_fields(body: dict, *, chat: bool) -> dict:
    """The sampling fields of a completion / chat request, checked; raises BadRequest naming the field."""
    allowed = {"model", "stream", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "ignore_eos",
               "logprobs", "echo", "max_completion_tokens", "top_logprobs"} | IGNORED
    allowed |= {"messages", "response_format", "tools", "tool_choice"} if chat else {"prompt"}
    for key in body:
        if key not in allowed:
            raise BadRequest(400, key, f"Unrecognized request argument supplied: {key}")
    reject_unsupported(body, chat=chat)
    if body.get("logprobs") not in (None, False, 0):
        raise BadRequest(400, "logprobs", "logprobs are not supported")
    if chat and body.get("tools"):
        raise BadRequest(400, "tools", "tool calls are not supported")
    fmt = body.get("response_format")
    if chat and fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise BadRequest(400, "response_format", "only {\"type\": \"text\"} is supported")
    if body.get("echo"):
        raise BadRequest(400, "echo", "echo is not supported")
    if not isinstance(body.get("stream", False), bool):
        raise BadRequest(400, "stream", f"stream must be true or false, got {body['stream']!r}")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise BadRequest(400, "stream_options", "stream_options must be an object")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) and s for s in stop) and len(stop) <= MAX_STOP:
        stop = tuple(stop)
    else:
        raise BadRequest(400, "stop", f"stop must be a non-empty string or a list of at most {MAX_STOP} of them")
    if any(not s for s in stop):
        raise BadRequest(400, "stop", "stop strings must not be empty")
    if not isinstance(body.get("ignore_eos", False), bool):
        raise BadRequest(400, "ignore_eos", "ignore_eos must be true or false")
    return dict(max_tokens=_number(body, name, 1, 1 << 31, integer=True),
                temperature=_number(body, "temperature", 0.0, MAX_TEMPERATURE),
                top_p=_number(body, "top_p", 0.0, 1.0),
                top_k=_number(body, "top_k", 0, 1 << 31, integer=True),
                seed=_number(body, "seed", -(1 << 63), (1 << 64) - 1, integer=True),
                stop=stop, ignore_eos=body.get("ignore_eos"), streaming=bool(body.get("stream", False)))


def text_size(text: str, field: str, max_bytes: int | None) -> int:
    """UTF-8 bytes of a prompt text, checked before any tokenizing. JSON can carry a lone surrogate
    (``"\\ud800"``) that no UTF-8 tokenizer takes: 400 naming the field. Over ``max_bytes``: 400 (the
    character count is checked first: a text never has fewer bytes than characters)."""
    if max_bytes is not None and len(text) > max_bytes:
        raise BadRequest(400, field, f"{field} is {len(text)} characters; this deployment takes at most "
                         f"{max_bytes} bytes of prompt text: shorten it")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise BadRequest(400, field, f"{field} is not valid Unicode (a lone surrogate at character "
                         f"{err.start}): send UTF-8 text") from None
    if max_bytes is not None and size > max_bytes:
        raise BadRequest(400, field, f"{field} is {size} bytes; this deployment takes at most {max_bytes} bytes "
                         "of prompt text: shorten it")
    return size


def prompt_fields(body: dict, max_bytes: int | None = None) -> dict:
    """/v1/completions: a string, a list with one string, or a list of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        text_size(prompt, "prompt", max_bytes)
        return {"prompt": prompt}
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return {"prompt_ids": list(prompt)}
    raise BadRequest(400, "prompt", "prompt must be a non-empty string (or one string in a list, or token ids)")


def chat_messages(body: dict, max_bytes: int | None = None) -> list[dict]:
    """The messages, checked; their text together is bounded by ``max_bytes`` (the templated prompt holds
    all of it, so a longer total cannot fit)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(400, "messages", "messages must be a non-empty list")
    out, total = [], 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise BadRequest(400, f"messages[{i}].role", "each message needs a role: system, user or assistant")
        content = m.get("content")
        if isinstance(content, list):     # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise BadRequest(400, f"messages[{i}].content", "only text content parts are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadRequest(400, f"messages[{i}].content", "content must be a string")
        left = None if max_bytes is None else max_bytes - total
        total += text_size(content, f"messages[{i}].content", left)
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    return out


def apply_chat_template(tokenizer, messages: list[dict]) -> list[int]:
    """The target's chat template, with the assistant turn opened (as dflash-generate does)."""
    if not getattr(tokenizer, "chat_template", None):
        raise BadRequest(400, "messages", "the target has no chat template: use /v1/completions")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _param(field: str, chat: bool, body: dict) -> str:
    """A request field name as the runtimes check it (Triton's input names) -> the OpenAI field the client sent."""
    if field in ("text_input", "prompt"):
        return "messages" if chat else "prompt"
    if field == "sampling_param_max_tokens" and body.get("max_completion_tokens") is not None:
        return "max_completion_tokens"
    return field.removeprefix("sampling_param_")


# ---- responses -----------------------------------------------------------------------------------------------
def usage(record: ServedRequest, final: Result) -> dict:
    prompt = final.num_prompt_tokens or record.num_prompt_tokens
    return {"prompt_tokens": prompt, "completion_tokens": final.num_output_tokens,
            "total_tokens": prompt + final.num_output_tokens}


_MARK = "\ue000dflash-text\ue000"   # stands for a chunk's text in its pre-encoded JSON (a private-use code point)


def dflash_stats(final: Result) -> dict:
    return {"num_draft_tokens": final.num_draft_tokens, "num_accepted_draft_tokens": final.num_accepted_draft_tokens,
            "acceptance_rate": round(final.acceptance_rate, 6), "num_steps": final.num_steps}


def finish_reason(final: Result) -> str:
    return "length" if final.finish_reason == "length" else "stop"


class OpenAIApp:
    """The endpoints over one runtime (anything with submit/cancel/health and the record interface).

    ``tokenize_workers``: prompts templated and tokenized at once (more wait their turn, holding only their
    body); the default is the machine's cores."""

    def __init__(self, runtime, tokenizer, model_name: str, tokenize_workers: int | None = None):
        from concurrent.futures import ThreadPoolExecutor

        self.runtime, self.tokenizer, self.model_name = runtime, tokenizer, model_name
        self.created = int(time.time())
        self.metrics = ServingMetrics(model_name)
        self.handoff: LoopHandoff | None = None   # the serving loop's, made on the first request
        # The runtime's own bound (as the Triton model reads it): None where it has none.
        self.max_prompt_bytes = getattr(runtime, "max_prompt_bytes", None)
        self.max_messages = max_messages(getattr(runtime, "max_seq_len", None), tokens_per_message(tokenizer))
        self._tokenize = ThreadPoolExecutor(max_workers=tokenize_workers or os.cpu_count() or 2,
                                            thread_name_prefix="dflash-tokenize")
        self.draining = ""                        # why new requests are refused ("" = serving)
        self.peer_metrics = list                  # the other API servers' series on this port (api_servers.py)

    def expire(self, why: str) -> int:
        """End every running request now with an error saying ``why`` (its client gets a final response:
        an SSE error event and [DONE], or a 503 body); the engine frees the slots. Returns how many. The
        runtime keeps the one map of running requests (``runtime.records()``), as for the Triton model."""
        records = self.runtime.records()
        for record in records:
            record.end_for_shutdown(why)
            self.runtime.cancel(record)
        return len(records)

    def make(self):
        """The FastAPI app."""
        from fastapi import FastAPI, Request
        from starlette.requests import ClientDisconnect
        from fastapi.responses import JSONResponse, StreamingResponse

        app = FastAPI(title="dflash-openai", docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(BadRequest)
        async def bad_request(_request, err: BadRequest):
            return JSONResponse(err.body(), status_code=err.status)

        @app.exception_handler(ClientDisconnect)
        async def client_left(_request, _err):     # mid-body: nobody reads an answer, no traceback either
            from fastapi.responses import Response
            return Response(status_code=499)

        @app.exception_handler(404)
        async def not_found(request, _err):
            return JSONResponse(BadRequest(404, None, f"no route {request.url.path}", code="not_found").body(),
                                status_code=404)

        @app.exception_handler(405)
        async def wrong_method(request, _err):
            return JSONResponse(BadRequest(405, None, f"{request.method} is not allowed on {request.url.path}").body(),
                                status_code=405)

        @app.get("/health")
        async def health():
            ok, reason = self.runtime.health()
            if self.draining:
                ok, reason = False, f"shutting down ({self.draining})"
            # running/waiting: requests holding or queued for a slot (a client that left must free its own)
            counts = {k: v for k, v in self.runtime.metrics().items() if k in ("running", "waiting", "steps")}
            return JSONResponse({"status": "ok" if ok else "unavailable", "reason": reason, **counts},
                                status_code=200 if ok else 503)

        @app.get("/metrics")
        async def metrics():
            from fastapi.responses import PlainTextResponse
            text = self.metrics.render(self.runtime.metrics(), self.peer_metrics())
            return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                                "owned_by": "trtllm-dflash"}]}

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await self._generate(request, chat=False, json_response=JSONResponse, stream_response=StreamingResponse)

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request):
            return await self._generate(request, chat=True, json_response=JSONResponse, stream_response=StreamingResponse)

        return app

    async def _body(self, request) -> dict:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > MAX_BODY_BYTES):
            raise BadRequest(413, None, f"the request body is over {MAX_BODY_BYTES} bytes")
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise BadRequest(413, None, f"the request body is over {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise BadRequest(400, None, "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadRequest(400, None, "the body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str):
            raise BadRequest(400, "model", "model is required (see GET /v1/models)")
        if model != self.model_name:
            raise BadRequest(404, "model", f"the model {model!r} does not exist; this server serves "
                             f"{self.model_name!r}", code="model_not_found")
        return body

    def _record(self, body: dict, chat: bool, client: str = "") -> ServedRequest:
        fields = sampling_fields(body, chat=chat)
        if chat:
            check_message_count(body.get("messages"), self.max_messages)
            fields["prompt_ids"] = apply_chat_template(self.tokenizer, chat_messages(body, self.max_prompt_bytes))
        else:
            fields.update(prompt_fields(body, self.max_prompt_bytes))
        return ServedRequest(**fields, request_id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
                             handoff=self.handoff, client=client)

    def _prepare(self, body: dict, chat: bool, client: str = "") -> ServedRequest:
        """Check, template, tokenize and submit (the runtime tokenizes raw text): on a bounded pool."""
        record = self._record(body, chat, client)
        self._submit(record, chat, body)
        return record

    def _submit(self, record: ServedRequest, chat: bool, body: dict) -> None:
        try:
            self.runtime.submit(record)
        except Unavailable as err:
            raise BadRequest(503, None, str(err), kind="service_unavailable") from None
        except DFlashError as err:       # named as the client named it: max_tokens, not sampling_param_max_tokens
            param = _param(err.field, chat, body)
            raise BadRequest(400, param, str(err).replace(err.field, param)) from None
        self.metrics.start(record)

    async def _results(self, record: ServedRequest):
        """The record's updates, each counted in /metrics as the client gets it; those that waited together come
        as one (record.abatches: a stream that falls behind sends fewer, larger chunks), the final one on its own."""
        async for batch in record.abatches():
            for result in batch:
                self.metrics.observe(record, result)
            final = batch[-1] if batch[-1].finished else None
            steps = batch[:-1] if final is not None else batch
            if steps:
                yield merged(steps)
            if final is not None:
                yield final

    def _unavailable(self) -> None:
        if self.draining:
            raise BadRequest(503, None, f"server: is shutting down ({self.draining}). Fix: send the request to "
                             "a running server", kind="service_unavailable")

    def _failed(self, final: Result) -> BadRequest:
        """A request's final error as the client gets it: 503 while draining (the request was ended for the
        shutdown), 500 otherwise."""
        if self.draining:
            return BadRequest(503, None, final.error, kind="service_unavailable")
        return BadRequest(500, None, final.error, kind="server_error")

    async def _generate(self, request, *, chat: bool, json_response, stream_response):
        self._unavailable()
        body = await self._body(request)
        loop = asyncio.get_running_loop()
        if self.handoff is None or self.handoff.loop is not loop:
            # The runtime hands each step's updates to this loop at once: one wake-up per step, not per stream.
            self.handoff = LoopHandoff(loop)
        # Templating and tokenizing run off the event loop (a long prompt must not stall other streams), on
        # a pool of bounded size (16 big prompts at once must not take 16 cores' memory).
        client = request.client.host if request.client else ""     # the engine's admission is fair between them
        record = await loop.run_in_executor(self._tokenize, self._prepare, body, chat, client)
        if self.draining:             # SIGTERM came while it was being tokenized
            self.expire(self.draining)
        if record.streaming:
            opts = body.get("stream_options") or {}
            return stream_response(self._stream(record, chat, bool(opts.get("include_usage")),
                                                 bool(opts.get("continuous_usage_stats"))),
                                   media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        final, text = await self._collect(record, request)
        if final is None:              # the client went away: its request is cancelled, nobody reads this
            return json_response({}, status_code=499)
        if final.error:
            raise self._failed(final)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None}
                  if chat else {"index": 0, "text": text, "logprobs": None})
        choice["finish_reason"] = finish_reason(final)
        return json_response({"id": record.request_id, "object": "chat.completion" if chat else "text_completion",
                              "created": int(time.time()), "model": self.model_name, "choices": [choice],
                              "usage": usage(record, final), "dflash": dflash_stats(final)})

    async def _collect(self, record: ServedRequest, request) -> tuple[Result | None, str]:
        """(final result, whole text) of a non-streaming request, or (None, "") once its client went away:
        the request is cancelled then, so it frees its slot at the engine's next step (Starlette does not
        cancel a handler whose client left; only the ASGI receive channel says so)."""
        async def collect():
            pieces, final = [], None
            async for result in self._results(record):
                pieces.append(result.text)
                final = result
            return final, "".join(pieces)

        async def gone():      # the body is read: the next message can only be http.disconnect
            while (await request.receive())["type"] != "http.disconnect":
                pass

        work, watch = asyncio.ensure_future(collect()), asyncio.ensure_future(gone())
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self.runtime.cancel(record)
            work.cancel()
            raise
        finally:
            watch.cancel()
        if work.done():
            return work.result()
        self.runtime.cancel(record)
        self.metrics.cancelled(record)
        work.cancel()
        return None, ""

    async def _stream(self, record: ServedRequest, chat: bool, include_usage: bool, continuous: bool):
        created, obj = int(time.time()), "chat.completion.chunk" if chat else "text_completion"

        def event(choices: list, **extra) -> str:
            data = {"id": record.request_id, "object": obj, "created": created, "model": self.model_name,
                    "choices": choices, **extra}
            return f"data: {json.dumps(data)}\n\n"

        def choice(text: str | None, reason: str | None) -> dict:
            if chat:
                return {"index": 0, "delta": {} if text is None else {"content": text}, "logprobs": None,
                        "finish_reason": reason}
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}

        # The chunk every step sends, encoded once around a marker: only its text is encoded per chunk (the same
        # bytes as event(); encoding the whole dict per row and step was a tenth of the frontend's time per token)
        head, tail = event([choice(_MARK, None)]).split(json.dumps(_MARK))

        def text_event(text: str) -> str:
            return head + json.dumps(text) + tail

        try:
            if chat:
                yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])
            async for result in self._results(record):
                if result.error:
                    err = self._failed(result).body()
                    yield f"data: {json.dumps(err)}\n\n"
                    break
                extra = {"usage": usage(record, result)} if continuous else {}
                if result.finished:
                    if result.text:
                        yield event([choice(result.text, None)], **extra)
                    yield event([choice(None, finish_reason(result))], dflash=dflash_stats(result), **extra)
                    if include_usage:
                        yield event([], usage=usage(record, result), dflash=dflash_stats(result))
                elif result.text:
                    yield event([choice(result.text, None)], **extra) if extra else text_event(result.text)
            yield "data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):   # the client went away mid-stream: free the slot
            self.runtime.cancel(record)
            self.metrics.cancelled(record)
            raise


# ---- command line ------------------------------------------------------------------------------------------
EXAMPLES = """examples:
  dflash-openai out/smollm2 --port 8080                 # http://127.0.0.1:8080/v1, model 'smollm2' (8000: dflash-serve)
  dflash-openai out/smollm2 --port 8081 --max_draft_len 0   # the same target alone: the AR baseline of a sweep
  curl -s localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}'
  python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8080/v1', api_key='none'); \\
print(c.chat.completions.create(model='smollm2', messages=[{'role': 'user', 'content': 'Hi'}]).choices[0].message)"
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dflash-openai", description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
                                formatter_class=HelpFormatter)
    p.add_argument("deployment_dir", help="a dflash-build deployment directory")
    p.add_argument("--host", default="127.0.0.1", help="listen address (loopback by default; 0.0.0.0 exposes it, "
                   "/health and /metrics included: they are public on this port)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port")
    p.add_argument("--served_model_name", default=None,
                   help="the model id clients send (default: the deployment directory's name)")
    p.add_argument("--drain_timeout_s", type=float, default=10.0,
                   help="on SIGTERM/SIGINT: seconds until every client has its final response (as dflash-serve): "
                        "running requests may finish until shortly before it (min(1 s, half of it)), then each gets "
                        "a final error (an SSE error event and [DONE], or a 503) and the server exits 0")
    p.add_argument("--tokenize_workers", type=int, default=None,
                   help="prompts templated/tokenized at once (default: the machine's cores); more wait their turn")
    p.add_argument("--max_draft_len", type=int, default=None,
                   help="drafted tokens per step, replacing the deployment's (torch backend); 0 = no drafting: "
                        "the target alone, autoregressive (the baseline a sweep compares DFlash with)")
    p.add_argument("--request_timeout_s", type=float, default=30.0,
                   help="seconds a connection has to send a request's head and body (from its opening, or from "
                        "the first byte of a later request); then it is closed")
    p.add_argument("--engine_address", default=None,
                   help="serve through the engine process already running at this ipc:// address (started with "
                        "python -m trtllm_dflash.serving.engine_core ENGINE_DIR --address ADDR), so that several "
                        "frontends share one engine; default: start one for this server")
    p.add_argument("--api_server_count", "--api_servers", type=int, default=None,
                   help="frontend processes on this port, one engine behind them (as vLLM's --api-server-count): "
                        "one process parses, detokenizes and frames ~18k request updates/s on an H200 host's CPU, "
                        "less than the engine makes for a small model at high concurrency; /metrics covers them all. "
                        "Default: one per 4 cores this process may run on, 1 to 4 (on one H100, SmolLM2 AR at "
                        "concurrency 64: through 4 it kept 0.85 of the in-process tokens/s, through 1 0.60, in two "
                        "runs of 256 and 128 new tokens)")
    p.add_argument("--log_level", default="warning", choices=("debug", "info", "warning", "error"))
    # set by --api_server_count's parent for each API server it starts (api_servers.py)
    for hidden in ("--listen_fd", "--api_server_index"):
        p.add_argument(hidden, type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--metrics_dir", default=None, help=argparse.SUPPRESS)
    return p


DRAIN_GRACE_S = 2.0     # after the final errors are sent: clients that do not read them are cut off


def default_api_server_count() -> int:
    """--api_server_count's default: one frontend per 4 cores this process may use, 1 to 4. The rest of the cores
    stay for the engine process's host work, the tokenizer threads and the clients of a benchmark on the same host;
    a 2-core machine (a laptop, CI) keeps the single frontend."""
    return max(1, min(4, len(os.sched_getaffinity(0)) // 4))


def expire_after_s(drain_timeout_s: float) -> float:
    """When running requests are ended with an error: early enough that their final events reach the clients
    within ``drain_timeout_s`` of the signal."""
    return drain_timeout_s - min(1.0, drain_timeout_s / 2)


def _server_class(openai_app: OpenAIApp, drain_timeout_s: float):
    import contextlib
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown, so the process would die by the signal
        before the runtime is shut down; here the signal only asks for the shutdown, and main() returns 0.
        The shutdown is bounded: uvicorn alone waits for every response to finish, however long."""

        async def shutdown(self, sockets=None):
            openai_app.draining = "the server is stopping"
            bound = asyncio.ensure_future(self._bound_drain())
            try:
                await super().shutdown(sockets)
            finally:
                bound.cancel()

        async def _bound_drain(self):
            await asyncio.sleep(expire_after_s(drain_timeout_s))
            n = openai_app.expire(f"drain timeout of {drain_timeout_s:g} s")
            log.warning("dflash-openai: drain timeout: ended %d running request(s) with an error", n)
            await asyncio.sleep(DRAIN_GRACE_S)
            self.force_exit = True

        @contextlib.contextmanager
        def capture_signals(self):
            old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)

    return Server


def check_attach(overrides: dict | None, engine_address: str | None) -> None:
    """Settings of an engine this server starts cannot apply to one it attaches to."""
    if engine_address and overrides:
        raise DFlashError(f"--{next(iter(overrides))}", "changes an engine this server starts, not one it attaches "
                          "to (--engine_address)", "start the engine process with --overrides, or drop it")


def load(deployment: Deployment, overrides: dict | None = None, engine_address: str | None = None):
    """(runtime, tokenizer) for a deployment; ``overrides``: RuntimeConfig fields for this server. The torch
    runtime runs in an engine process of its own (started here, or the one already running at
    ``engine_address``: several frontends, one engine)."""
    from .runtimes import load_runtime

    if engine_address:
        from ..checkpoints.text import load_tokenizer
        from .engine_client import EngineClient
        from .engine_core import check_address

        check_attach(overrides, engine_address)
        runtime = EngineClient(check_address(engine_address), load_tokenizer(deployment.target_dir),
                               ready_timeout_s=60)
    else:
        runtime = load_runtime(deployment, overrides)
    tokenizer = getattr(runtime, "tokenizer", None) or getattr(getattr(runtime, "engine", None), "tokenizer", None)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(deployment.target_dir))
    return runtime, tokenizer


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import uvicorn
    except ImportError:
        raise DFlashError("dflash-openai", "needs FastAPI and uvicorn",
                          "pip install 'trtllm-dflash[openai]'") from None
    from .deployment_check import check_deployment
    from .openai_limits import check_port, timed_protocol

    deployment_dir = Path(args.deployment_dir).expanduser().resolve()
    name = args.served_model_name or deployment_dir.name
    if args.drain_timeout_s < 0:
        raise DFlashError("--drain_timeout_s", f"is {args.drain_timeout_s}", "pass seconds >= 0")
    if args.request_timeout_s <= 0:
        raise DFlashError("--request_timeout_s", f"is {args.request_timeout_s}", "pass seconds > 0")
    if args.tokenize_workers is not None and args.tokenize_workers < 1:
        raise DFlashError("--tokenize_workers", f"is {args.tokenize_workers}", "pass 1 or more")
    overrides = {}
    if args.max_draft_len is not None:
        if args.max_draft_len < 0:
            raise DFlashError("--max_draft_len", f"is {args.max_draft_len}", "pass 0 (no drafting) or more")
        overrides["block_size"] = args.max_draft_len + 1
    if args.api_server_count is None:
        args.api_server_count = default_api_server_count()
    if args.api_server_count < 1:
        raise DFlashError("--api_server_count", f"is {args.api_server_count}", "pass 1 or more")
    worker = args.listen_fd is not None
    if not worker:
        check_port(args.host, args.port)      # before the model loads (tens of seconds), not after
    deployment = check_deployment(Deployment.open(deployment_dir))
    if args.api_server_count > 1 and not worker:
        from . import api_servers

        check_attach(overrides, args.engine_address)
        args.served_model_name = name
        return api_servers.serve(args, deployment, overrides,
                                 drain_s=args.drain_timeout_s + DRAIN_GRACE_S + 10)
    runtime, tokenizer = load(deployment, overrides, args.engine_address)
    openai_app = OpenAIApp(runtime, tokenizer, name, args.tokenize_workers)
    app = openai_app.make()
    server = _server_class(openai_app, args.drain_timeout_s)(uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
        http=timed_protocol(args.request_timeout_s)))
    board, stop_publishing = None, threading.Event()
    if worker:     # one of --api_server_count's API servers: the parent's socket, the others' metrics
        import socket

        from .api_servers import MetricsBoard, watch_parent

        board = MetricsBoard(args.metrics_dir, args.api_server_index)
        openai_app.peer_metrics = board.peers
        board.start_publishing(openai_app.metrics, stop_publishing)
        watch_parent(lambda: setattr(server, "should_exit", True))

    def announce():     # once the socket listens (lifespan startup runs before it is bound)
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started and board is not None:
            board.mark_ready()
        elif server.started:
            print(f"dflash-openai: ready on http://{args.host}:{args.port}/v1 (model {name!r})", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run(sockets=[socket.socket(fileno=args.listen_fd)] if worker else None)
    finally:
        stop_publishing.set()
        runtime.shutdown()
    return 0


if __name__ == "__main__":
    import sys

    from trtllm_dflash.cli import openai_main

    sys.exit(openai_main(sys.argv[1:]))
