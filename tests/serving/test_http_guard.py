# SPDX-License-Identifier: Apache-2.0
"""dflash-serve's HTTP guard: the checks as data, then against a real tritonserver (Triton 2.51 from
nvidia-pytriton 0.7.0) through real HTTP clients (http.client, urllib, tritonclient)."""
from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from tests.serving.conftest import start_server
from trtllm_dflash.serving import client
from trtllm_dflash.serving.http_guard import GuardLimits, Refused, atoi, bracket_depth, check_body, json_part, rewrite_body
from trtllm_dflash.serving.protocol import CLIENT_HEADER
from trtllm_dflash.serving.http_request import BadTarget, from_h11, origin_form

GEN = "/v2/models/tensorrt_llm/generate"


def nested(depth: int) -> bytes:
    return b'{"text_input": "hi", "x": ' + b"[" * depth + b"]" * depth + b"}"


def test_depth_and_json_part():
    assert bracket_depth(b"1") == 0 and bracket_depth(b"{}") == 1 and bracket_depth(b'{"a": [[1], {"b": []}]}') == 4
    assert bracket_depth(nested(500)) == 501 and bracket_depth(b"[" * 10**6) == 10**6   # invalid JSON counts too
    assert bracket_depth(b'{"a": "[[[[\\"[[[", "b": "}}}"}') == 1      # brackets inside strings do not
    assert (atoi(" 12abc"), atoi("abc"), atoi("-3"), atoi("")) == (12, 0, -3, 0)
    body = b'{"a": 1}\0\0'
    assert json_part({"inference-header-content-length": "8"}, body) == body[:8]
    for value in ("0", "x", "-1", "99"):          # Triton then parses the whole body
        assert json_part({"inference-header-content-length": value}, body) == body
    assert json_part({}, body) == body


def test_request_targets_become_origin_form():
    # #37: Triton routes an absolute-form target (RFC 9112 3.2.2) as its path; the guard must see that path
    assert origin_form("/v2/models/m/generate?x=1") == ("/v2/models/m/generate", "?x=1", "")
    assert origin_form("http://localhost/v2/models/m/generate") == ("/v2/models/m/generate", "", "localhost")
    assert origin_form("HTTP://a:1?q") == ("/", "?q", "a:1")
    assert origin_form("https://a") == ("/", "", "a")
    for bad in ("*", "localhost:8000", "/v2/models/tensorrt%5Fllm/generate", "//v2/models", "/v2/./models",
                "/v2/../v2/models", "/v2#x", "http://a/v2/%2e%2e/x", "x/y", "http://a\\v2"):
        with pytest.raises(BadTarget):
            origin_form(bad)
    req = from_h11(b"POST", b"http://h:1/v2/models/m/generate", [
        (b"host", b"other"), (b"connection", b"keep-alive, x-hop"), (b"x-hop", b"1"), (b"content-length", b"3"),
        (b"transfer-encoding", b"chunked"), (b"triton-grpc-protocol-admin-key", b"k"), (b"admin-key", b"k"),
        (b"content-type", b"application/json"), (b"expect", b"100-continue"), (b"te", b"trailers")],
        drop=("admin-key",))
    assert (req.method, req.target, req.host) == ("POST", "/v2/models/m/generate", "h:1")
    assert req.headers == [("content-type", "application/json")]


@pytest.mark.parametrize("target, headers, body, status, field", [
    (GEN, {}, nested(65), 400, "body"),
    (GEN, {}, nested(50_000), 400, "body"),                       # json.loads' own recursion bound
    (GEN, {}, nested(60), None, None),
    (GEN, {"content-type": "application/x-www-form-urlencoded"}, b'{"text_input": "%s"}' % (b"x" * (1 << 20)),
     415, "Content-Type"),
    (GEN, {"content-type": "application/x-www-form-urlencoded"}, b'{"text_input": "hi"}', None, None),
    (GEN, {}, b'{"text_input": "hi", "streaming": true}', 400, "streaming"),
    (GEN + "?x=1", {}, b'{"text_input": "hi", "stream": [true]}', 400, "stream"),
    ("/v2/models/tensorrt_llm/versions/1/generate", {}, b'{"streaming": true}', 400, "streaming"),
    (GEN + "_stream", {}, b'{"text_input": "hi", "streaming": true}', None, None),
    (GEN, {}, b'{"text_input": "hi", "streaming": false}', None, None),
    (GEN, {}, b"not json", 400, "body"),                          # Triton 2.51 answers some of these 500
    (GEN, {}, b"", 400, "body"),
    (GEN, {}, b'{"text_input": "\xff"}', 400, "body"),                # not UTF-8
    (GEN, {}, b'[1]', 400, "body"),
    ("/v2/models/other/generate", {}, b"not json", None, None),   # not our model: Triton's own answer
    # Triton parses the JSON part whatever the Content-Type, and all of it when the binary header is 0 / bad
    (GEN, {"content-type": "application/octet-stream"}, nested(1000), 400, "body"),
    ("/v2/models/m/infer", {"inference-header-content-length": "0"}, nested(1000), 400, "body"),
    ("/v2/models/m/infer", {"inference-header-content-length": "zz"}, b"[" * 100_000, 400, "body"),
    ("/v2/repository/index", {"content-type": "text/plain"}, b"[" * 100_000, 400, "body"),
    # values that Triton would cast without a range check, or answer 500 to
    (GEN, {}, b'{"text_input": "hi", "sampling_param_max_tokens": 4294967304}', 400, "sampling_param_max_tokens"),
    (GEN, {}, b'{"text_input": "hi", "sampling_param_max_tokens": 2147483648}', 400, "sampling_param_max_tokens"),
    (GEN, {}, b'{"text_input": "hi", "sampling_param_max_tokens": "ten"}', 400, "sampling_param_max_tokens"),
    (GEN, {}, b'{"text_input": "hi", "sampling_param_temperature": 1e30}', None, None),   # the model's bound
    (GEN, {}, b'{"text_input": "hi", "sampling_param_temperature": 1e39}', 400, "sampling_param_temperature"),
    (GEN, {}, b'{"text_input": "hi", "sampling_param_max_tokens": 0}', None, None),        # the model's bound
    (GEN, {}, b'{"text_input": "hi", "sampling_param_temperature": "NaN"}', 400, "sampling_param_temperature"),
    (GEN, {}, b'{"text_input": "hi", "sampling_param_temperature": NaN}', 400, "body"),
    (GEN, {}, b'{"text_input": "hi", "sampling_param_temperature": Infinity}', 400, "body"),
    (GEN, {}, b'{"text_input": "hi", "sampling_param_seed": -1}', 400, "sampling_param_seed"),
    (GEN, {}, b'{"text_input": "hi", "sampling_param_seed": 18446744073709551616}', 400, "sampling_param_seed"),
    (GEN, {}, b'{"text_input": 5}', 400, "text_input"),
    (GEN, {}, b'{"text_input": ["hi"], "streaming": [false], "sampling_param_seed": 18446744073709551615, '
              b'"sampling_param_temperature": 2, "sampling_param_max_tokens": [3]}', None, None),
    ("/v2/models/tensorrt_llm/infer", {}, b'{"inputs": [{"name": "sampling_param_max_tokens", "shape": [1], '
     b'"datatype": "INT32", "data": [4294967304]}]}', 400, "sampling_param_max_tokens"),
    ("/v2/models/tensorrt_llm/infer", {}, b'{"inputs": [{"name": "text_input", "shape": [1], '
     b'"datatype": "FP32", "data": [1]}]}', 400, "text_input"),
    ("/v2/models/tensorrt_llm/infer", {}, b'{"inputs": 3}', 400, "inputs"),
    # the binary tensor extension: only the JSON header is parsed
    ("/v2/models/m/infer", {"inference-header-content-length": "2"}, b"{}" + b"[" * 100, None, None),
    ("/v2/models/m/infer", {"inference-header-content-length": str(len(nested(80)))}, nested(80) + b"\0",
     400, "body"),
])
def test_check_body(target, headers, body, status, field):
    if status is None:
        check_body(target, headers, body, GuardLimits())
        return
    with pytest.raises(Refused) as err:
        check_body(target, headers, body, GuardLimits())
    assert err.value.status == status and err.value.err.field == field and err.value.err.fix


@pytest.fixture(scope="module")
def guarded_server(tiny_deployment, tmp_path_factory):
    server = start_server(tiny_deployment, tmp_path_factory.mktemp("guard") / "dflash-serve.log")
    yield server
    assert server.stop() == 0, server.log_text()[-4000:]


def _post(addr: str, path: str, body: bytes, headers: dict, send_body: bool = True) -> tuple[int, str]:
    host, port = addr.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        if send_body:
            conn.request("POST", path, body=body, headers=headers)
        else:         # the head alone, as curl does with Expect: 100-continue
            conn.putrequest("POST", path)
            for k, v in {**headers, "Content-Length": str(len(body)), "Expect": "100-continue"}.items():
                conn.putheader(k, v)
            conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


@pytest.mark.slow
def test_hostile_bodies_get_4xx_and_triton_keeps_serving(guarded_server):
    # #19: a >= 4 MiB form body and JSON nested 50,000 deep killed Triton 2.51 with SIGSEGV (every running
    # request died with it); /generate with streaming true ran the whole generation, then answered 200 with
    # an error body.
    srv = guarded_server
    running = client.generate_http(srv.http, client.build_inputs("hello", streaming=True, max_tokens=64))
    first = next(running)                  # a stream in flight all along: it must end normally
    form = json.dumps({"text_input": "x" * (4 << 20)}).encode()
    cases = [
        (form, {"Content-Type": "application/x-www-form-urlencoded"}, True, 415, "Content-Type: application/x-www"),
        (nested(50_000), {"Content-Type": "application/json"}, True, 400, "body: JSON nested deeper than 64"),
        (b"x" * (17 << 20), {"Content-Type": "application/json"}, False, 413, "body: 17825792 bytes is over"),
        (b'{"text_input": "hi", "streaming": true}', {}, True, 400, "streaming: is true on /generate"),
    ]
    for body, headers, send_body, status, message in cases:
        t0 = time.monotonic()
        got, text = _post(srv.http, GEN, body, headers, send_body)
        assert (got, json.loads(text)["error"][:len(message)]) == (status, message), text[:300]
        assert ". Fix: " in text and time.monotonic() - t0 < 30
    rest = client.collect(running)
    assert "text_output" in first and rest["finish_reason"] == "length"
    assert "exited with code" not in srv.log_text() and srv.log_text().count("dflash-serve: ready in") == 1
    ok = client.collect(client.generate_http(srv.http, client.build_inputs("hi", max_tokens=4)))
    assert ok["finish_reason"] == "length"


@pytest.mark.slow
def test_keep_alive_and_binary_clients_work_through_the_guard(guarded_server):
    import numpy as np
    import tritonclient.http as httpclient

    host, port = guarded_server.http.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps({"text_input": "hi", "sampling_param_max_tokens": 3}).encode()
    sockets = set()
    for _ in range(3):           # one connection, three requests
        conn.request("POST", GEN, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["finish_reason"] == "length"
        sockets.add(id(conn.sock))
    assert len(sockets) == 1
    conn.close()
    # tritonclient's HTTP client (keep-alive, binary tensor data): the model's metadata and a unary infer
    # are what the decoupled model allows over /infer: Triton's own error, relayed as it is
    tc = httpclient.InferenceServerClient(guarded_server.http)
    assert tc.is_server_ready() and tc.get_model_metadata("tensorrt_llm")["name"] == "tensorrt_llm"
    text = httpclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hi"], dtype=np.object_), binary_data=True)
    with pytest.raises(Exception, match="decoupled"):
        tc.infer("tensorrt_llm", [text])
    assert tc.is_server_live()
    tc.close()


@pytest.mark.slow
@pytest.mark.parametrize("guard", ["true", pytest.param("false", marks=pytest.mark.exhaustive)])
def test_sigterm_with_an_idle_keep_alive_connection_exits_0(tiny_deployment, tmp_path, guard):
    # #19: the CPU soak's dflash-serve exited 1 after SIGTERM. Triton 2.51 waits for open HTTP connections
    # (an idle keep-alive one too) out of --exit_timeout_secs, then finds the model still loaded and exits 1.
    # Through the guard the connections close before Triton is told to stop; without it, a stop that ended
    # every request is still a clean stop.
    srv = start_server(tiny_deployment, tmp_path / "dflash-serve.log", "--exit_timeout_secs", "2",
                       "--http_guard", guard)
    try:
        host, port = srv.http.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", GEN, body=json.dumps({"text_input": "hi", "sampling_param_max_tokens": 2}).encode(),
                     headers={"Content-Type": "application/json"})
        assert conn.getresponse().read()
        rc = srv.stop(60)
        log = srv.log_text()
        assert rc == 0, log[-3000:]
        if guard == "true":       # the guard had closed Triton's connections: it did not wait for them
            assert "HTTP service connections" not in log, log[-3000:]
        else:
            assert "HTTP service connections" in log, "the case this test is about did not arise"
        conn.close()
    finally:
        srv.stop(10)


@pytest.mark.slow
def test_a_client_that_vanishes_mid_stream_is_cancelled_through_the_guard(guarded_server):
    srv = guarded_server
    host, port = srv.http.split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    body = json.dumps({"text_input": "hello", "sampling_param_max_tokens": 200, "streaming": True}).encode()
    sock.sendall(f"POST {GEN}_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert b"data:" in sock.recv(65536) or b"data:" in sock.recv(65536)
    before = _cancelled(srv)
    sock.close()
    deadline = time.monotonic() + 60
    while _cancelled(srv) == before:
        assert time.monotonic() < deadline, "the vanished client's request was not cancelled"
        time.sleep(0.2)


def _cancelled(srv) -> float:
    return srv.metric_or_zero("dflash_requests_total", finish_reason="cancelled")


SMALL = b'{"text_input": "%s"}' % (b"x" * 282)     # 300 bytes


def test_memory_bound_over_all_connections_and_no_triton():
    # No tritonserver behind it (restarting): 503 naming the server. Bodies held by all connections together
    # are bounded: a request whose body would pass the bound is refused while another one holds it. What
    # counts is the bytes received, not the length announced (#37: four slow clients announcing 16 MiB and
    # sending a byte each took the whole budget).
    from tests.serving.conftest import free_port
    from trtllm_dflash.serving.http_guard import HttpGuard

    guard = HttpGuard("127.0.0.1", free_port(), free_port(), GuardLimits(max_buffered_bytes=1000))
    guard.start()
    try:
        addr = f"127.0.0.1:{guard.port}"
        status, text = _post(addr, GEN, b'{"text_input": "hi"}', {"Content-Type": "application/json"})
        assert status == 503 and json.loads(text)["error"].startswith("server: tritonserver is not running")
        holder = socket.create_connection(("127.0.0.1", guard.port), timeout=30)
        holder.sendall(f"POST {GEN} HTTP/1.1\r\nHost: x\r\nContent-Length: 800\r\n\r\n".encode() + b"{")
        _until(lambda: guard.buffered == 1)    # announced 800, sent 1: holds 1
        holder.sendall(b" " * 798)
        _until(lambda: guard.buffered == 799)
        status, text = _post(addr, GEN, SMALL, {"Content-Type": "application/json"})
        assert status == 503 and "bytes of other requests' bodies" in json.loads(text)["error"]
        holder.close()
        _until(lambda: guard.buffered == 0)    # released when the holder goes away
        status, _ = _post(addr, GEN, SMALL, {"Content-Type": "application/json"})
        assert status == 503                   # admitted this time, then Triton is not there
    finally:
        guard.stop()


def _until(cond, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_slow_clients_are_bounded_per_client_and_in_time():
    # #25: four connections each announcing 16 MiB and sending one byte held the whole 64-MiB budget for
    # good while /v2/health/ready said 200. Now one client holds at most max_client_bytes (429 beyond), a
    # request must arrive within read_timeout_s (408), and ready says 503 while a full body cannot be taken.
    from tests.serving.conftest import free_port
    from trtllm_dflash.serving.http_guard import HttpGuard

    limits = GuardLimits(max_body_bytes=1000, max_buffered_bytes=2500, max_client_bytes=1500, read_timeout_s=1.5)
    guard = HttpGuard("127.0.0.1", free_port(), free_port(), limits)
    guard.start()
    try:
        addr = f"127.0.0.1:{guard.port}"
        holders = []
        for _ in range(2):
            s = socket.create_connection(("127.0.0.1", guard.port), timeout=30)
            s.sendall(f"POST {GEN} HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n".encode() + b"{" * 799)
            holders.append(s)
            time.sleep(0.3)
        assert guard.buffered == 799                        # the second one would pass 1500
        reply = holders[1].recv(65536).decode()
        assert reply.startswith("HTTP/1.1 429") and "per-client bound of 1500" in reply, reply
        # the budget left (1701) still takes a full body, so ready is relayed (and Triton is not there)
        status, text = _get(addr, "/v2/health/ready")
        assert status == 503 and "tritonserver is not running" in text
        guard.buffered += 900                  # as if another client held 900 more: 801 left < max_body_bytes
        status, text = _get(addr, "/v2/health/ready")
        assert status == 503 and "not ready: request bodies being received hold 1699 of 2500" in text, text
        guard.buffered -= 900
        t0 = time.monotonic()
        reply = holders[0].recv(65536).decode()            # the first holder: timed out
        assert reply.startswith("HTTP/1.1 408") and "--read_timeout_s" in reply, reply
        assert time.monotonic() - t0 < 3
        _until(lambda: not guard.buffered and not guard.clients, 10)
        for s in holders:
            s.close()
    finally:
        guard.stop()


def _get(addr: str, path: str) -> tuple[int, str]:
    host, port = addr.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def test_rewrite_body_names_each_non_streaming_generate_and_says_who_sent_it():
    """#25: a non-streaming /generate gets an id (when it has none) the guard can send a stop for; its
    Content-Length follows the new body; a client's own id and cancel_key are kept. Every generate of our model
    carries the client's address as the guard saw it (a client's own value replaced): fair admission. Other
    endpoints and other models pass unchanged."""
    def req(target, obj, peer="10.1.2.3"):
        return rewrite_body("POST", target, json.dumps(obj).encode(), peer)

    body, handle = req("/v2/models/tensorrt_llm/generate", {"text_input": "hi"})
    path, rid, key = handle
    assert path == "/v2/models/tensorrt_llm/generate" and rid.startswith("guard-") and key == ""
    assert json.loads(body) == {"text_input": "hi", "id": rid, "parameters": {CLIENT_HEADER: "10.1.2.3"}}
    body, handle = req("/v2/models/tensorrt_llm/generate",
                       {"text_input": "hi", "id": "mine", "parameters": {"cancel_key": "k", CLIENT_HEADER: "spoof"}})
    assert handle[1:] == ("mine", "k") and json.loads(body)["id"] == "mine"
    assert json.loads(body)["parameters"] == {"cancel_key": "k", CLIENT_HEADER: "10.1.2.3"}
    body, handle = req("/v2/models/tensorrt_llm/generate_stream", {"text_input": "hi"})
    assert handle is None and json.loads(body) == {"text_input": "hi", "parameters": {CLIENT_HEADER: "10.1.2.3"}}
    for target in ("/v2/models/other/generate", "/v2/models/tensorrt_llm/infer"):
        assert req(target, {"text_input": "hi"}) == (json.dumps({"text_input": "hi"}).encode(), None)
    assert req("/v2/models/tensorrt_llm/generate", "not an object")[1] is None
    assert req("/v2/models/tensorrt_llm/generate", {"text_input": "hi", "parameters": 5})[1] is None


def test_infer_cannot_name_its_own_client():
    body = json.dumps({"inputs": [], "parameters": {CLIENT_HEADER: "10.0.0.9"}}).encode()
    with pytest.raises(Refused, match=f"parameters.{CLIENT_HEADER}: is set by the server"):
        check_body("/v2/models/tensorrt_llm/infer", {"content-type": "application/json"}, body, GuardLimits())

def test_upstream_headers_say_who_the_client_is_whatever_it_claims():
    from trtllm_dflash.serving.http_request import from_h11, upstream_headers

    req = from_h11(b"POST", b"/v2/models/tensorrt_llm/generate",
                   [(b"host", b"x"), (b"dflash-client", b"spoof"), (b"x-dflash-client", b"spoof2"), (b"a", b"b")])
    assert upstream_headers(req, 5, "10.1.2.3") == [("host", "x"), ("a", "b"), (CLIENT_HEADER, "10.1.2.3"),
                                                    ("content-length", "5")]
