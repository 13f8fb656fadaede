# SPDX-License-Identifier: Apache-2.0
"""Sweep clients of running servers. Each has ``send(i, item) -> RequestRecord`` (blocking, one request,
never raises) for ``drivers.run_threaded_level``, and ``close()``.

``TritonClient``: the ``tensorrt_llm`` model over a gRPC stream (one stream per client thread), as
dflash-serve or NGC's Triton serve it. ``OpenAIClient``: ``/v1/completions`` with server-sent events, as
``trtllm-serve`` serves it. Chunk times are taken when a response arrives, before any parsing.
"""
from __future__ import annotations

import http.client
import itertools
import json
import queue
import threading
import time
import urllib.parse

import numpy as np

from ..errors import DFlashError
from .metrics import RequestRecord
from .workload import WorkItem, chunk_token_counts

MODEL_NAME = "tensorrt_llm"
_ids = itertools.count()


class TritonClient:
    def __init__(self, url: str, tokenizer, *, max_tokens: int, temperature: float, seed: int, ignore_eos: bool,
                 streaming: bool = True, model: str = MODEL_NAME, timeout: float = 600.0):
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        self.url, self.model, self.tokenizer, self.timeout = url, model, tokenizer, timeout
        self._grpc = grpcclient
        try:
            probe = grpcclient.InferenceServerClient(url)
            config = probe.get_model_config(model, as_json=True)["config"]
            probe.close()
        except InferenceServerException as err:
            raise DFlashError("--url", f"cannot get model {model!r} from the Triton server at {url} ({err})",
                              "start dflash-serve (gRPC port, default 8001) or check --url / --model") from None
        inputs = {i["name"] for i in config.get("input", [])}
        self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        if streaming and not self.decoupled:
            raise DFlashError("--streaming", f"model {model!r} is not decoupled, so it cannot stream",
                              "serve it decoupled (dflash-serve --fill --decoupled_mode true) or pass --no_streaming")
        if ignore_eos and "sampling_param_ignore_eos" not in inputs:
            raise DFlashError("--ignore_eos", f"model {model!r} has no sampling_param_ignore_eos input",
                              "drop --ignore_eos (outputs then end at EOS; the row records the real OSL)")
        self._inputs = {"streaming": streaming, "sampling_param_max_tokens": np.int32(max_tokens),
                        "sampling_param_temperature": np.float32(temperature), "sampling_param_seed": np.uint64(seed)}
        if ignore_eos:
            self._inputs["sampling_param_ignore_eos"] = True
        self._local = threading.local()
        self._clients: list = []
        self._lock = threading.Lock()

    def _tensors(self, text: str, seed_offset: int) -> list:
        values = {"text_input": np.array([text.encode()], dtype=np.object_),
                  **{k: np.array([v]) for k, v in self._inputs.items()}}
        values["sampling_param_seed"] = values["sampling_param_seed"] + np.uint64(seed_offset)
        kinds = {np.object_: "BYTES", np.bool_: "BOOL", np.int32: "INT32", np.float32: "FP32", np.uint64: "UINT64"}
        tensors = []
        for name, arr in values.items():
            t = self._grpc.InferInput(name, list(arr.shape), kinds[arr.dtype.type])
            t.set_data_from_numpy(arr)
            tensors.append(t)
        return tensors

    def _stream(self):
        """This thread's client and its response queue (its stream carries one request at a time)."""
        if not hasattr(self._local, "client"):
            client, responses = self._grpc.InferenceServerClient(self.url), queue.Queue()
            if self.decoupled:
                # The arrival time is taken in the callback, before the response waits in the queue.
                client.start_stream(callback=lambda result, error: responses.put((time.perf_counter(), result, error)))
            self._local.client, self._local.responses = client, responses
            with self._lock:
                self._clients.append(client)
        return self._local.client, self._local.responses

    def send(self, i: int, item: WorkItem) -> RequestRecord:
        rec = RequestRecord(t_sent=0.0, num_prompt_tokens=len(self.tokenizer.encode(item.text)))
        rid = f"dflash-sweep-{next(_ids)}"
        pieces: list[tuple[float, str, int | None]] = []
        try:
            client, responses = self._stream()
            tensors = self._tensors(item.text, i)
            rec.t_sent = time.perf_counter()
            if not self.decoupled:   # one response: a plain infer (a stream needs a decoupled model's final flag)
                result = client.infer(self.model, tensors, request_id=rid, client_timeout=self.timeout)
                rec.t_done = time.perf_counter()
                self._read(result, rec.t_done, rec, pieces)
            else:
                client.async_stream_infer(self.model, tensors, request_id=rid, enable_empty_final_response=True)
                while rec.t_done is None:
                    t, result, error = responses.get(timeout=self.timeout)
                    if error is not None:
                        rec.error = str(error)
                        self._drop_stream()
                        break
                    if result.get_response().id == rid:   # else: late, of an earlier request that timed out
                        self._read(result, t, rec, pieces)
                        if result.get_response().parameters["triton_final_response"].bool_param:
                            rec.t_done = t
        except queue.Empty:
            rec.error = f"no response within {self.timeout:.0f} s"
        except Exception as err:  # noqa: BLE001 - a failed request is a counted error, not a crashed sweep
            rec.error = f"{type(err).__name__}: {err}"
            self._drop_stream()
        counts = [n for _, _, n in pieces]
        if not all(n is not None for n in counts):   # a server without the count: the text tokenized again
            counts = chunk_token_counts(self.tokenizer, [p for _, p, _ in pieces])
        for (t, _, _), n in zip(pieces, counts):
            rec.add_chunk(t, n)
        return rec

    def _drop_stream(self) -> None:
        """Close this thread's client after an error: tritonclient refuses every later request on a stream that
        reported one ("no longer in valid state"), so without a fresh stream one failure would fail the thread's
        remaining requests too and the sweep would count them as the server's errors."""
        client = getattr(self._local, "client", None)
        if client is None:
            return
        del self._local.client, self._local.responses
        with self._lock:
            self._clients = [c for c in self._clients if c is not client]
        try:
            self._shut(client, cancel_requests=True)
        except Exception:  # noqa: BLE001 - a broken stream may fail to close; the next request opens a new one
            pass

    def _shut(self, client, cancel_requests: bool = False) -> None:
        if self.decoupled:
            client.stop_stream(cancel_requests=cancel_requests)
        client.close()

    @staticmethod
    def _read(result, t: float, rec: RequestRecord, pieces: list) -> None:
        """One response's text piece (arrived at t) and its token count, and on the last one how the request
        ended."""
        def value(name):
            return result.as_numpy(name).reshape(-1)[0]

        names = {o.name for o in result.get_response().outputs}
        if "text_output" in names:   # with the tokens it carries where the server says (sequence_length)
            pieces.append((t, value("text_output").decode("utf-8", "replace"),
                           int(value("sequence_length")) if "sequence_length" in names else None))
        if "finish_reason" in names:
            rec.finish_reason = value("finish_reason").decode()
            rec.num_draft_tokens = int(value("total_draft_tokens"))
            rec.num_accepted_draft_tokens = int(value("total_accepted_draft_tokens"))

    def close(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, []
        for c in clients:
            self._shut(c)


class OpenAIClient:
    def __init__(self, url: str, tokenizer, *, max_tokens: int, temperature: float, seed: int, ignore_eos: bool,
                 streaming: bool = True, model: str | None = None, timeout: float = 600.0):
        parsed = urllib.parse.urlparse(url if "://" in url else f"http://{url}")
        self.host, self.port, self.timeout, self.tokenizer = parsed.hostname, parsed.port or 80, timeout, tokenizer
        self.streaming = streaming
        self.model = model or self._first_model()
        self.body = {"model": self.model, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
                     "stream": streaming, "ignore_eos": ignore_eos}
        if streaming:
            # Usage in every chunk gives exact tokens per chunk (vLLM's and trtllm-serve's extension).
            self.body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}

    def _first_model(self) -> str:
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            conn.request("GET", "/v1/models")
            models = json.loads(conn.getresponse().read())["data"]
            conn.close()
            return models[0]["id"]
        except (OSError, ValueError, KeyError, IndexError) as err:
            raise DFlashError("--url", f"cannot list models at http://{self.host}:{self.port}/v1/models ({err})",
                              "start trtllm-serve, check --url, or pass --model") from None

    def send(self, i: int, item: WorkItem) -> RequestRecord:
        rec = RequestRecord(t_sent=0.0)
        pieces: list[tuple[float, str, int | None]] = []   # (arrival, text, cumulative completion tokens)
        usage: dict = {}
        dflash: dict = {}
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            body = json.dumps({**self.body, "prompt": item.text, "seed": self.body["seed"] + i})
            rec.t_sent = time.perf_counter()
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {resp.read()[:300].decode('utf-8', 'replace')}"
                return rec
            events = (line[5:].strip() for line in resp if line.startswith(b"data:")) if self.streaming \
                else iter([resp.read()])
            for data in events:
                t = time.perf_counter()
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                usage = obj.get("usage") or usage
                dflash = obj.get("dflash") or dflash      # dflash-openai's extension: draft statistics
                for choice in obj.get("choices") or []:
                    pieces.append((t, choice.get("text") or "", (obj.get("usage") or {}).get("completion_tokens")))
                    rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
            rec.t_done = time.perf_counter()
            conn.close()
        except Exception as err:  # noqa: BLE001 - a failed request is a counted error, not a crashed sweep
            rec.error = f"{type(err).__name__}: {err}"
        rec.num_prompt_tokens = usage.get("prompt_tokens") or len(self.tokenizer.encode(item.text))
        rec.num_draft_tokens = int(dflash.get("num_draft_tokens", 0))
        rec.num_accepted_draft_tokens = int(dflash.get("num_accepted_draft_tokens", 0))
        rec.num_steps = int(dflash.get("num_steps", 0))
        cumulative = [c for _, _, c in pieces]
        if pieces and all(c is not None for c in cumulative):
            counts = np.diff([0] + cumulative).tolist()
        else:
            counts = chunk_token_counts(self.tokenizer, [p for _, p, _ in pieces])
        for (t, _, _), n in zip(pieces, counts):
            rec.add_chunk(t, int(n))
        return rec

    def close(self) -> None:
        pass


def open_client(server: str, url: str, tokenizer_source: str, **kw):
    """A client for ``server`` (triton | openai) with its own tokenizer: what each client process of
    ``drivers.run_process_level`` builds for itself."""
    from transformers import AutoTokenizer
    cls = TritonClient if server == "triton" else OpenAIClient
    return cls(url, AutoTokenizer.from_pretrained(tokenizer_source), **kw)
