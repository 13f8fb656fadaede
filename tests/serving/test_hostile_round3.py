# SPDX-License-Identifier: Apache-2.0
"""#37: hostile traffic that knocked over dflash-serve (real tritonserver 2.51 from nvidia-pytriton, both guards
on) once the round-2 guards were in: absolute-form targets, Triton's metrics port, framing the guard and Triton
read differently, slow-loris from several addresses, idle keep-alive connections and idle gRPC streams. Each
test checks the server stays up (same tritonserver, dflash-serve running) and serves a real request after."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from tests.serving.conftest import start_server
from tests.serving.test_hostile_triton import _post_raw, _send, _triton_pid
from trtllm_dflash.serving import client

pytestmark = pytest.mark.slow
GEN = "/v2/models/tensorrt_llm/generate"
ABS = "http://localhost" + GEN
IDLE_S = 4
GRPC_IDLE_S = 4


@pytest.fixture(scope="module")
def srv(tiny_deployment, tmp_path_factory):
    server = start_server(tiny_deployment, tmp_path_factory.mktemp("round3") / "dflash-serve.log",
                          "--read_timeout_s", "3", "--idle_timeout_s", str(IDLE_S),
                          "--grpc_idle_stream_s", str(GRPC_IDLE_S), "--max_restarts", "0")
    yield server
    assert server.stop(30) == 0, server.log_text()[-3000:]


def _alive(srv, pid: int) -> None:
    """The same tritonserver serves a real request; dflash-serve never restarted it."""
    assert srv.proc.poll() is None and _triton_pid(srv) == pid, srv.log_text()[-3000:]
    assert "exited with code" not in srv.log_text()
    out = client.collect(client.generate_http(srv.http, client.build_inputs("hi", max_tokens=3)))
    assert out["finish_reason"] == "length"


def _exchange(sock: socket.socket, raw: bytes) -> tuple[int, bytes]:
    """Send ``raw`` on a kept-alive socket and read one response."""
    sock.sendall(raw)
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    return resp.status, resp.read()


def _connect(srv, source: str = "127.0.0.1") -> socket.socket:
    host, port = srv.http.split(":")
    return socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0))


def test_absolute_form_targets_are_checked_as_their_path(srv):
    # Finding 1: absolute-form POSTs were "not our endpoint" to the guard and generate to Triton; this one
    # killed tritonserver in 0.03 s (four of them ended dflash-serve). Finding 6: the same path re-opened
    # invalid JSON -> Triton 500 and max_tokens 2^32+8 -> 200 with a wrapped value.
    pid = _triton_pid(srv)
    deep = b"[" * 1_000_000 + b"]" * 1_000_000
    for target in (ABS, "HTTP://127.0.0.1:1" + GEN):
        status, body = _send(srv, _post_raw(target, deep, "Inference-Header-Content-Length: 2"))
        assert status == 400 and "nested deeper" in body, (target, body)
    # infer reads only the header's 2 bytes as JSON ("[["): not JSON, refused as that
    status, body = _send(srv, _post_raw(ABS.replace("/generate", "/infer"), deep, "Inference-Header-Content-Length: 2"))
    assert status == 400 and "is not JSON" in body, body
    for raw, field in ((b"not json", "body"), (b"", "body"),
                       (b'{"text_input": "hi", "sampling_param_max_tokens": 4294967304}', "sampling_param_max_tokens")):
        status, body = _send(srv, _post_raw(ABS, raw, "Content-Type: application/json"))
        assert status == 400 and json.loads(body)["error"].startswith(f"{field}: "), body
    for target in ("/v2/models/tensorrt%5Fllm/generate", "//v2/models/tensorrt_llm/generate", "*",
                   "/v2/models/./tensorrt_llm/generate"):
        status, body = _send(srv, _post_raw(target, b'{"text_input": "hi"}'))
        assert status == 400 and json.loads(body)["error"].startswith("request target: "), (target, body)
    with _connect(srv) as s:                       # (the answer may be chunked: http.client reads it)
        status, body = _exchange(s, _post_raw(ABS, b'{"text_input": "hi", "sampling_param_max_tokens": 3}'))
    assert status == 200 and json.loads(body)["finish_reason"] == "length", body
    _alive(srv, pid)


def _cancelled(srv) -> float:
    return srv.metric_or_zero("dflash_requests_total", finish_reason="cancelled")


def test_absolute_form_generate_whose_client_left_is_stopped(srv):
    # Finding 2: non-streaming absolute-form generates whose clients gave up kept their slots for 270 s (the
    # guard's stop-on-disconnect only knew origin-form targets).
    before = _cancelled(srv)
    body = json.dumps({"text_input": "Count: 1, 2,", "sampling_param_max_tokens": 200,
                       "sampling_param_ignore_eos": True}).encode()
    socks = [_connect(srv) for _ in range(3)]
    for s in socks:
        s.sendall(_post_raw(ABS, body, "Content-Type: application/json").replace(b"Connection: close\r\n", b""))
    time.sleep(0.5)
    for s in socks:
        s.close()
    deadline = time.monotonic() + 15
    while _cancelled(srv) < before + 3:
        assert time.monotonic() < deadline, "the left requests were not cancelled"
        time.sleep(0.2)


def test_the_metrics_port_serves_only_get_metrics(srv):
    # Finding 3: POST /metrics with a 5 MiB form body on Triton's metrics port (on --host, no guard) ->
    # SIGSEGV. It is Triton's Unix socket behind a guard now.
    pid = _triton_pid(srv)
    host, port = srv.metrics.split(":")
    big = b"a=" + b"x" * (5 << 20)
    for method, path, want in (("POST", "/metrics", 405), ("PUT", "/metrics", 405), ("GET", "/v2/health/ready", 404),
                               ("POST", "http://x/metrics", 405)):
        with socket.create_connection((host, int(port)), timeout=30) as s:
            raw = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                   f"Content-Length: {len(big)}\r\n\r\n").encode()
            s.sendall(raw)
            try:
                s.sendall(big)
            except OSError:
                pass          # refused after the head, and the rest discarded for a moment only
            reply = s.recv(65536).decode(errors="replace")
        assert reply.startswith(f"HTTP/1.1 {want}"), reply[:300]
    text = http.client.HTTPConnection(host, int(port), timeout=10)
    text.request("GET", "/metrics")
    r = text.getresponse()
    assert r.status == 200 and b"nv_inference_request_success" in r.read()
    text.close()
    _alive(srv, pid)


@pytest.mark.parametrize("te", ["CHUNKED", "\tchunked", "Chunked "])
def test_chunked_any_case_is_decoded_once_and_the_connection_stays_in_step(srv, te):
    # Finding 7: "Transfer-Encoding: CHUNKED" (or ":\tchunked") was decoded by the guard, not by Triton,
    # which answered 500 and then read the leftover chunk bytes as the next request.
    body = b'{"text_input": "hi", "sampling_param_max_tokens": 2}'
    chunked = f"{len(body) - 10:x}\r\n".encode() + body[:-10] + b"\r\n" + b"a;ext=1\r\n" + body[-10:] + b"\r\n0\r\n\r\n"
    with _connect(srv) as s:
        for _ in range(2):        # a second request on the same connection: no leftover bytes upstream
            status, answer = _exchange(s, f"POST {GEN} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:{te}\r\n\r\n"
                                          .encode() + chunked)
            assert status == 200 and json.loads(answer)["finish_reason"] == "length", answer


@pytest.mark.parametrize("size", ["0x34", "3_4", "+34", "-ffffff", " 34", "34 x", "", "ffffffffffffffffffffff"])
def test_bad_chunk_sizes_get_an_answer(srv, size):
    # Finding 7: these closed the connection with no response.
    pid = _triton_pid(srv)
    raw = f"POST {GEN} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\n".encode() + b"x" * 52
    status, body = _send(srv, raw + b"\r\n0\r\n\r\n")
    assert status in (400, 413), body
    assert json.loads(body)["error"].split(":")[0] in ("request", "body"), body
    assert _triton_pid(srv) == pid


@pytest.mark.parametrize("length", ["\u00b2", "1_0", "+10", "0x10", "10, 11", "-1", "١٠"])
def test_content_length_is_ascii_digits(srv, length):
    # Finding 7: "Content-Length: ²" passed str.isdigit and raised in the guard.
    raw = f"POST {GEN} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode() + b"{" * 10
    status, body = _send(srv, raw)
    assert status == 400, body


def test_slow_loris_from_several_addresses_does_not_deny_service(srv):
    # Finding 8: 4 loopback addresses reconnecting after each 408 denied every real POST (503) for the whole
    # attack with ~400 bytes per 30 s: the announced lengths were reserved. Now bytes received count.
    pid = _triton_pid(srv)
    holders = []
    for i in range(2, 6):
        for _ in range(8):
            s = _connect(srv, f"127.0.0.{i}")
            s.sendall(f"POST {GEN} HTTP/1.1\r\nHost: x\r\nContent-Length: {16 << 20}\r\n\r\n{{".encode())
            holders.append(s)
    try:
        host, port = srv.http.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", "/v2/health/ready")
        assert conn.getresponse().status == 200
        conn.close()
        _alive(srv, pid)
    finally:
        for s in holders:
            s.close()


def test_idle_keep_alive_connections_do_not_lock_their_address_out(srv):
    # Finding 8: 1,000 idle keep-alive connections from one address got every request from it 429, ready
    # included, for as long as they were held; there was no first-byte timeout either.
    pid = _triton_pid(srv)
    idle = [_connect(srv) for _ in range(300)]        # over the per-address bound (256)
    try:
        time.sleep(0.5)
        host, port = srv.http.split(":")
        for path in ("/v2/health/ready", "/v2/health/live"):
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request("GET", path)
            assert conn.getresponse().status == 200, path
            conn.close()
        _alive(srv, pid)
        t0 = time.monotonic()
        for s in idle:            # each one was closed: evicted, or after the idle timeout
            s.settimeout(IDLE_S + 10)
            assert s.recv(1) == b""
        assert time.monotonic() - t0 < IDLE_S + 5
    finally:
        for s in idle:
            s.close()


def test_idle_grpc_streams_end_and_make_room(srv):
    # Finding 9: 256 idle ModelStreamInfer streams got every other client RESOURCE_EXHAUSTED for as long as
    # they were held. Now a new call ends the longest-idle stream at the bound, and idle streams end after
    # --grpc_idle_stream_s.
    import grpc

    pid = _triton_pid(srv)
    channel = grpc.insecure_channel(srv.grpc)
    stop = threading.Event()

    def never():
        stop.wait()
        return
        yield

    method = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    calls = [method(never()) for _ in range(130)]      # over the per-address bound (128)
    try:
        time.sleep(1.5)
        out = client.collect(client.generate_grpc(srv.grpc, client.build_inputs("hi", max_tokens=3)))
        assert out["finish_reason"] == "length"
        t0 = time.monotonic()
        codes = set()
        for call in calls:
            try:
                list(call)
            except grpc.RpcError as err:
                codes.add(err.code())
        assert codes <= {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
        assert grpc.StatusCode.DEADLINE_EXCEEDED in codes
        assert time.monotonic() - t0 < GRPC_IDLE_S + 4
    finally:
        stop.set()
        channel.close()
    _alive(srv, pid)


def test_a_start_that_dies_before_ready_is_retried_within_the_restart_bound(tiny_deployment, tmp_path):
    # Finding 5: tritonserver 2.51 aborted (SIGABRT) before ready in 1 of ~21 starts and dflash-serve gave up.
    # A `tritonserver` first on PATH aborts its first start the same way, then runs the real one.
    import os
    import shlex
    import subprocess
    import sys

    from tests.serving.conftest import TEST_ENV, free_port, terminate, wait_logged
    from trtllm_dflash.serving.triton_env import pytriton_binary

    real = pytriton_binary()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in real.env.items())
    (bindir / "tritonserver").write_text(
        f"#!/bin/bash\nif [ ! -e {tmp_path}/started ]; then touch {tmp_path}/started; kill -ABRT $$; fi\n{exports}"
        f"exec {shlex.quote(real.path)} \"$@\" --backend-directory={shlex.quote(real.backend_dir)} "
        "--allow-gpu-metrics=false\n")
    (bindir / "tritonserver").chmod(0o755)
    env = {**TEST_ENV, "PATH": f"{bindir}{os.pathsep}{TEST_ENV['PATH']}"}
    log = tmp_path / "dflash-serve.log"
    cmd = [sys.executable, "-m", "trtllm_dflash.serving.server", str(tiny_deployment), "--http_port", str(free_port()),
           "--grpc_port", str(free_port()), "--metrics_port", str(free_port()), "--max_restarts", "1"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        wait_logged(proc, log, "dflash-serve: ready", 120, stop_timeout=10)
        text = log.read_text(errors="replace")
        assert "tritonserver exited with code -6 before it was ready; starting it again (1 of at most 1)" in text, text
    finally:
        assert terminate(proc, 30) == 0, log.read_text(errors="replace")[-3000:]
