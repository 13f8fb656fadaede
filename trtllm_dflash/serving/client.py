# SPDX-License-Identifier: Apache-2.0
"""dflash-client: send one prompt to the ``tensorrt_llm`` model of a running server and print the text
(as it comes, with --streaming) and the DFlash stats.

HTTP uses Triton's generate extension (``/generate``, ``/generate_stream``): Triton's ``/infer`` and so
``tritonclient.http`` refuse decoupled models. gRPC uses ``tritonclient.grpc``: a bidirectional stream
for a decoupled model, a unary infer otherwise.
"""
from __future__ import annotations

import argparse
import http.client
import json
import queue
import sys
import urllib.error
import urllib.request
from typing import Iterator

import numpy as np

from ..bench.helpformat import HelpFormatter
from ..errors import DFlashError

MODEL_NAME = "tensorrt_llm"
STAT_NAMES = ("finish_reason", "stop_reason", "acceptance_rate", "total_accepted_draft_tokens",
              "total_draft_tokens", "arrival_time_ns", "first_token_time_ns", "last_token_time_ns")
# Triton datatypes of the inputs a client may send (config.pbtxt)
_DTYPES = {"streaming": np.bool_, "sampling_param_max_tokens": np.int32, "sampling_param_temperature": np.float32,
           "sampling_param_top_k": np.int32, "sampling_param_top_p": np.float32, "sampling_param_seed": np.uint64,
           "sampling_param_exclude_input_from_output": np.bool_, "sampling_param_ignore_eos": np.bool_}

EPILOG = """examples:
  dflash-client "def fibonacci(n):" --max_tokens 64
  dflash-client "def fibonacci(n):" --protocol grpc --streaming
  dflash-client "Hello" --url 10.0.0.5:8000 --temperature 0.7 --top_p 0.9 --seed 1 --json
"""


def build_inputs(prompt: str, streaming: bool = False, **sampling) -> dict[str, object]:
    """Input name -> value for one request; ``sampling`` keys are SamplingParams names (``max_tokens``, ...)."""
    inputs: dict[str, object] = {"text_input": prompt, "streaming": streaming}
    for key, value in sampling.items():
        if value is not None:
            inputs[f"sampling_param_{key}"] = value
    return inputs


def _http_body(inputs: dict[str, object]) -> bytes:
    return json.dumps({k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}).encode()


def _http_error(err: urllib.error.HTTPError) -> DFlashError:
    body = err.read().decode("utf-8", "replace")
    try:
        body = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        pass
    return DFlashError("server", f"HTTP {err.code}: {body}")


def _json(data: bytes) -> dict:
    try:
        return json.loads(data)
    except ValueError:
        raise DFlashError("server", f"sent something that is not JSON: {data[:200]!r}",
                          "check that --url points at dflash-serve's HTTP port") from None


def generate_http(url: str, inputs: dict[str, object], model: str = MODEL_NAME, timeout: float = 600.0
                  ) -> Iterator[dict]:
    """Each response of the generate extension as a dict of outputs (one, or a stream with ``streaming``)."""
    streaming = bool(inputs.get("streaming"))
    endpoint = f"http://{url}/v2/models/{model}/{'generate_stream' if streaming else 'generate'}"
    request = urllib.request.Request(endpoint, data=_http_body(inputs), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            if not streaming:
                yield _json(r.read())
                return
            final = False
            for line in r:   # server-sent events: "data: {...}" lines
                if line.startswith(b"data:"):
                    event = _json(line[5:])
                    if "error" in event:
                        raise DFlashError("server", event["error"])
                    final = "finish_reason" in event
                    yield event
            if not final:    # the last event of every request carries finish_reason
                raise DFlashError("server", "the stream ended without a final response: the text above is "
                                  "truncated (did the server stop or crash?)", "check the server, send it again")
    except (http.client.IncompleteRead, ConnectionError) as err:
        raise DFlashError("server", f"the response was cut off ({type(err).__name__}): did the server stop or "
                          "crash?", "check the server, send it again") from None
    except urllib.error.HTTPError as err:
        raise _http_error(err) from None
    except urllib.error.URLError as err:
        raise DFlashError("url", f"cannot reach {url} ({err.reason})", "start dflash-serve, or check --url") from None
    except TimeoutError:
        raise DFlashError("server", f"no response within {timeout:.0f} s", "raise --timeout_s") from None


def _grpc_input(grpcclient, name: str, value):
    if name in ("text_input", "sampling_param_stop"):
        arr = np.array([v.encode() if isinstance(v, str) else v for v in np.atleast_1d(value)], dtype=np.object_)
        datatype = "BYTES"
    else:
        arr = np.array([value], dtype=_DTYPES.get(name, np.int32))
        datatype = {np.bool_: "BOOL", np.int32: "INT32", np.float32: "FP32", np.uint64: "UINT64"}[arr.dtype.type]
    tensor = grpcclient.InferInput(name, list(arr.shape), datatype)
    tensor.set_data_from_numpy(arr)
    return tensor


def _grpc_outputs(result) -> dict:
    out = {}
    for o in result.get_response().outputs:
        value = result.as_numpy(o.name).reshape(-1)[0]
        out[o.name] = value.decode("utf-8") if isinstance(value, bytes) else value.item()
    return out


def generate_grpc(url: str, inputs: dict[str, object], model: str = MODEL_NAME, request_id: str = "",
                  timeout: float = 600.0) -> Iterator[dict]:
    """Each response over gRPC as a dict of outputs: a stream for a decoupled model, else one infer."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    try:
        tensors = [_grpc_input(grpcclient, k, v) for k, v in inputs.items()]
        config = client.get_model_config(model, as_json=True)["config"]
        if not config.get("model_transaction_policy", {}).get("decoupled", False):
            yield _grpc_outputs(client.infer(model, tensors, request_id=request_id, client_timeout=timeout))
            return
        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put(error or result))
        finished = False
        try:
            client.async_stream_infer(model, tensors, request_id=request_id, enable_empty_final_response=True)
            while not finished:
                try:
                    item = responses.get(timeout=timeout)
                except queue.Empty:
                    raise DFlashError("server", f"no response within {timeout:.0f} s", "raise --timeout_s") from None
                if isinstance(item, Exception):
                    finished = True     # an error response is the request's last
                    raise DFlashError("server", str(item))
                finished = item.get_response().parameters["triton_final_response"].bool_param
                if item.get_response().outputs:
                    yield _grpc_outputs(item)
        finally:
            # A consumer that stops early (or a timeout) cancels the request: the server frees its slot.
            client.stop_stream(cancel_requests=not finished)
    except InferenceServerException as err:
        raise DFlashError("server", str(err)) from None
    finally:
        client.close()


def generate(url: str, inputs: dict[str, object], protocol: str = "http", **kw) -> Iterator[dict]:
    return generate_grpc(url, inputs, **kw) if protocol == "grpc" else generate_http(url, inputs, **kw)


def collect(responses: Iterator[dict]) -> dict:
    """The responses of one request merged: ``text_output`` joined, ``sequence_length`` summed (the generated
    tokens), stats from the last response."""
    merged: dict = {"text_output": "", "num_responses": 0}
    for r in responses:
        merged["num_responses"] += 1
        merged.update({k: v for k, v in r.items() if k in STAT_NAMES})
        merged["text_output"] += r.get("text_output", "")
        if "sequence_length" in r:
            merged["sequence_length"] = merged.get("sequence_length", 0) + int(r["sequence_length"])
    return merged


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dflash-client", description=__doc__, epilog=EPILOG,
                                formatter_class=HelpFormatter)
    p.add_argument("text_input", help="the prompt (raw text; apply a chat template yourself if you want one)")
    p.add_argument("--url", default=None, help="host:port [default: localhost:8000 (http), localhost:8001 (grpc)]")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--model_name", default=MODEL_NAME)
    p.add_argument("--streaming", action="store_true", help="print the text as it is generated")
    p.add_argument("--max_tokens", type=int, default=None, help="[default: the server's]")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy [default: the server's]")
    p.add_argument("--top_k", type=int, default=None)
    p.add_argument("--top_p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--ignore_eos", action="store_true", default=None, help="generate exactly --max_tokens tokens")
    p.add_argument("--request_id", default="", help="id that a later `stop` request can cancel (gRPC)")
    p.add_argument("--timeout_s", "--timeout", type=float, default=600.0,
                   help="seconds to wait for the whole response (--timeout still parses)")
    p.add_argument("--json", action="store_true", help="print one JSON object: text and stats")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")
    inputs = build_inputs(args.text_input, args.streaming, max_tokens=args.max_tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=args.stop,
                          ignore_eos=args.ignore_eos)
    kw = {"model": args.model_name, "timeout": args.timeout_s}
    if args.protocol == "grpc":
        kw["request_id"] = args.request_id
    responses = generate(url, inputs, args.protocol, **kw)

    def printing(items):
        for r in items:
            if args.streaming and not args.json:
                print(r.get("text_output", ""), end="", flush=True)
            yield r

    merged = collect(printing(responses))
    if args.json:
        print(json.dumps(merged, ensure_ascii=False))
        return 0
    print("" if args.streaming else merged["text_output"])
    stats = " ".join(f"{k}={merged[k]}" for k in ("finish_reason", "acceptance_rate", "total_accepted_draft_tokens",
                                                  "total_draft_tokens") if k in merged)
    print(f"[{stats} responses={merged['num_responses']}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from ..cli import client_main

    sys.exit(client_main(sys.argv[1:]))
