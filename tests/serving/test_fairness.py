# SPDX-License-Identifier: Apache-2.0
"""One address that queues many requests does not hold every slot: through the real servers (dflash-serve's
guards -> tritonserver -> the model -> the engine process, and dflash-openai), the engine admits a second
address's request at the first free slot, ahead of the first address's older queued ones."""
from __future__ import annotations

import http.client
import json
import threading
import time

import pytest

from tests.serving.conftest import RUNTIME, make_deployment, start_server, terminate
from tests.serving.test_openai_server import OpenAIServer
from trtllm_dflash.serving.metrics import PREFIX

SLOTS = 2
FLOOD = 2 * SLOTS + 1      # three waves of the flood under FIFO: the other client's request would wait for the third


@pytest.fixture(scope="module")
def two_slot_deployment(tmp_path_factory, tiny_target_with_tokenizer):
    return make_deployment(tmp_path_factory.mktemp("fair") / "tiny2", *tiny_target_with_tokenizer,
                           runtime={**RUNTIME, "max_batch_size": SLOTS})


def _post(url: str, path: str, body: dict, source: str) -> None:
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=300, source_address=(source, 0))
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status == 200, data[:500]
    finally:
        conn.close()


def _race(send, long_body: dict, short_body: dict, queued) -> tuple[list[float], float]:
    """FLOOD long requests from 127.0.0.2, then (once they hold every slot and the rest wait) one short request
    from 127.0.0.3. Finish times: the flood's, sorted, and the short one's."""
    done: dict[str, list[float]] = {"flood": [], "other": []}

    def one(kind, body, source):
        send(body, source)
        done[kind].append(time.monotonic())

    threads = [threading.Thread(target=one, args=("flood", long_body, "127.0.0.2")) for _ in range(FLOOD)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not queued() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert queued(), "the flood never filled the slots"
    other = threading.Thread(target=one, args=("other", short_body, "127.0.0.3"))
    other.start()
    for t in [*threads, other]:
        t.join(300)
    assert len(done["flood"]) == FLOOD and len(done["other"]) == 1
    return sorted(done["flood"]), done["other"][0]


@pytest.mark.slow
def test_triton_admits_another_address_at_the_first_free_slot(two_slot_deployment, tmp_path):
    srv = start_server(two_slot_deployment, tmp_path / "dflash-serve.log")
    try:
        path = "/v2/models/tensorrt_llm/generate"
        long_body = {"text_input": "Tell me a long story", "sampling_param_max_tokens": 48,
                     "sampling_param_ignore_eos": True}
        short_body = {"text_input": "Hi", "sampling_param_max_tokens": 2, "sampling_param_ignore_eos": True}
        flood, other = _race(lambda body, src: _post(srv.http, path, body, src), long_body, short_body,
                             lambda: srv.metric_or_zero("dflash_waiting_requests") >= FLOOD - SLOTS)
        # FIFO would run it in the third wave, after the second wave's flood requests ended
        assert other < flood[SLOTS], (other, flood)
    finally:
        assert srv.stop() == 0, srv.log_text()[-3000:]


@pytest.mark.slow
@pytest.mark.exhaustive   # the same scheduler as the Triton test; only the peer's address is the server's own
def test_openai_admits_another_address_at_the_first_free_slot(two_slot_deployment, tmp_path):
    srv = OpenAIServer(two_slot_deployment, tmp_path / "server.log", "tiny")
    try:
        url = f"127.0.0.1:{srv.port}"
        long_body = {"model": "tiny", "prompt": "Tell me a long story", "max_tokens": 48, "ignore_eos": True}
        short_body = {"model": "tiny", "prompt": "Hi", "max_tokens": 2, "ignore_eos": True}

        def queued() -> bool:
            text = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
            text.request("GET", "/metrics")
            lines = text.getresponse().read().decode().splitlines()
            text.close()
            waiting = [line for line in lines if line.startswith(PREFIX + "num_requests_waiting")]
            return bool(waiting) and float(waiting[0].rsplit(" ", 1)[1]) >= FLOOD - SLOTS

        flood, other = _race(lambda body, src: _post(url, "/v1/completions", body, src), long_body, short_body,
                             queued)
        assert other < flood[SLOTS], (other, flood)
    finally:
        assert terminate(srv.proc, 30) == 0, srv.log.read_text()[-3000:]
