# SPDX-License-Identifier: Apache-2.0
"""dflash-openai's bounds that need no model: the time a connection has to send its request (real uvicorn with
the protocol dflash-openai runs), the message-count bound a chat template implies, the port check."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.serving.conftest import free_port
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving.openai_limits import check_port, max_messages, timed_protocol, tokens_per_message

uvicorn = pytest.importorskip("uvicorn")


@pytest.fixture
def app_server():
    async def app(scope, receive, send):          # a plain ASGI app: reads the body, answers 200
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           http=timed_protocol(1.0), timeout_keep_alive=30))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(10)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(65536) == b"" or sock.recv(65536) == b""
    except TimeoutError:
        return False


def test_silent_and_half_sent_requests_are_closed(app_server):
    # #37 finding 10: uvicorn kept 1,000 silent connections open indefinitely
    silent = socket.create_connection(("127.0.0.1", app_server))
    half_head = socket.create_connection(("127.0.0.1", app_server))
    half_head.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n")
    half_body = socket.create_connection(("127.0.0.1", app_server))
    half_body.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
    t0 = time.monotonic()
    for s in (silent, half_head, half_body):
        assert _closed_within(s, 5), "still open"
    assert time.monotonic() - t0 < 3
    # a whole request, then the same connection waits for the next one (keep-alive) without being cut at 1 s
    ok = socket.create_connection(("127.0.0.1", app_server), timeout=5)
    for pause in (0, 1.5):
        time.sleep(pause)
        ok.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while not got.endswith(b"ok"):
            chunk = ok.recv(65536)
            assert chunk, got
            got += chunk
    for s in (silent, half_head, half_body, ok):
        s.close()


def test_the_message_bound_follows_the_template(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    per = tokens_per_message(tok)
    assert per >= 3                   # <|im_start|>user\n ... <|im_end|>\n
    assert max_messages(512, per) == 512 // per and max_messages(None, per) is None


def test_check_port_names_the_flag():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        with pytest.raises(DFlashError, match=r"^--port: port \d+ on 127.0.0.1 is not free"):
            check_port("127.0.0.1", busy.getsockname()[1])
    check_port("127.0.0.1", free_port())
