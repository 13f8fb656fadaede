# SPDX-License-Identifier: Apache-2.0
"""dflash-openai against real clients: the official ``openai`` SDK (chat, completions, streaming) on the real
SmolLM2 pair (greedy: streamed == non-streamed == dflash-generate's chat output), OpenAI-shaped 4xx errors that
leave the server serving, and dflash-sweep --server openai == --server triton on the same prompts."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.serving.conftest import TEST_ENV, free_port, terminate, wait_logged

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow
PROMPT = "Write one sentence about the sea."


class OpenAIServer:
    def __init__(self, deployment_dir: Path, log: Path, name: str = "smol", *extra: str):
        self.port, self.log = free_port(), log
        cmd = [sys.executable, "-m", "trtllm_dflash.serving.openai_server", str(deployment_dir), "--port", str(self.port),
               "--served_model_name", name, "--api_server_count", "1", *extra]
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=TEST_ENV)
        wait_logged(self.proc, log, "dflash-openai: ready", 180, stop_timeout=30)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.client = openai.OpenAI(base_url=self.url, api_key="none", max_retries=0, timeout=120)

    def post(self, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=body, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def stop(self) -> int:
        return terminate(self.proc, 30)


@pytest.fixture(scope="module")
def smol_deployment(tmp_path_factory, smollm2_dir):
    """A real dflash-build output: SmolLM2-135M-Instruct and the drafter that ships with the package."""
    from trtllm_dflash import build, build_config

    # fixed: these tests compare two servers' acceptance; adaptive blocks follow each one's measured step costs
    cfg = build_config.BuildConfig(target="smollm2-135m", drafter="smollm2-135m-dflash", gpu="cpu",
                                   max_batch_size=4, max_seq_len=512, draft_policy="fixed",
                                   out=str(tmp_path_factory.mktemp("openai") / "smol"))
    return build.build(cfg, log=lambda *_: None)


@pytest.fixture(scope="module")
def server(smol_deployment, tmp_path_factory):
    srv = OpenAIServer(smol_deployment, tmp_path_factory.mktemp("openai_log") / "server.log")
    yield srv
    rc = srv.stop()
    assert rc == 0, f"exit code {rc}: {srv.log.read_text()[-3000:]}"


def test_sdk_chat_streamed_equals_non_streamed_equals_dflash_generate(server, smol_deployment, tmp_path):
    c = server.client
    assert [m.id for m in c.models.list().data] == ["smol"]
    messages = [{"role": "user", "content": PROMPT}]
    whole = c.chat.completions.create(model="smol", messages=messages, max_tokens=16, temperature=0)
    text = whole.choices[0].message.content
    assert whole.choices[0].finish_reason in ("stop", "length") and text
    pieces, last = [], None
    for chunk in c.chat.completions.create(model="smol", messages=messages, max_tokens=16, temperature=0,
                                           stream=True, stream_options={"include_usage": True}):
        for ch in chunk.choices:
            pieces.append(ch.delta.content or "")
        last = chunk
    assert "".join(pieces) == text
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    stats = whole.model_extra["dflash"]
    assert stats["num_draft_tokens"] > 0 and 0 <= stats["num_accepted_draft_tokens"] <= stats["num_draft_tokens"]
    # dflash-generate applies the same chat template by default (greedy, the same deployment)
    out = tmp_path / "gen.json"
    proc = subprocess.run([sys.executable, "-c", "import sys; from trtllm_dflash.cli import generate_main; "
                           "sys.exit(generate_main(sys.argv[1:]))", "--engine_dir", str(smol_deployment),
                           "--prompt", PROMPT, "--max_new_tokens", "16", "--max_seq_len", "512", "--json", str(out)],
                          capture_output=True, text=True, env=TEST_ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["dflash"]
    assert row["text"] == text and len(row["output_ids"]) == whole.usage.completion_tokens


def test_sdk_completions_streaming_and_stop(server):
    c = server.client
    whole = c.completions.create(model="smol", prompt="The capital of France is", max_tokens=12, temperature=0)
    text = whole.choices[0].text
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="smol", prompt="The capital of France is", max_tokens=12, temperature=0, stream=True) if ch.choices)
    assert streamed == text and whole.usage.completion_tokens <= 12
    word = text.split()[1] if len(text.split()) > 1 else text.strip()[:2]
    cut = c.completions.create(model="smol", prompt="The capital of France is", max_tokens=12, temperature=0,
                               stop=[word])
    assert cut.choices[0].finish_reason == "stop" and word not in cut.choices[0].text
    assert text.startswith(cut.choices[0].text)
    sampled = [c.completions.create(model="smol", prompt="Once upon a time", max_tokens=8, temperature=0.9,
                                    top_p=0.9, seed=7).choices[0].text for _ in range(2)]
    assert sampled[0] == sampled[1]      # same seed, same sample


@pytest.mark.parametrize("path, body, status, param", [
    ("/chat/completions", {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
     400, "temperature"),
    ("/chat/completions", {"model": "smol", "messages": []}, 400, "messages"),
    ("/chat/completions", {"model": "smol", "messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages[0].role"),
    ("/chat/completions", {"model": "smol", "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
    ("/completions", {"model": "smol", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/completions", {"model": "smol", "prompt": "x", "max_tokens": 100000}, 400, "max_tokens"),
    ("/completions", {"model": "smol", "prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("/completions", {"model": "smol", "prompt": "x", "stop": ["a"] * 100}, 400, "stop"),
    ("/completions", {"model": "smol", "prompt": "x", "best_of_all": 1}, 400, "best_of_all"),
    ("/completions", {"model": "smol", "prompt": ""}, 400, "prompt"),
    ("/completions", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ("/completions", {"prompt": "x"}, 400, "model"),
])
def test_bad_requests_get_openai_shaped_errors_and_the_server_keeps_serving(server, path, body, status, param):
    code, err = server.post(path, json.dumps(body).encode())
    assert code == status and set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["param"] == param, err
    ok = server.client.completions.create(model="smol", prompt="Hi", max_tokens=2, temperature=0)
    assert ok.choices[0].text is not None


def test_malformed_bodies_and_the_sdk_error_type(server):
    assert server.post("/completions", b"{not json")[0] == 400
    assert server.post("/completions", b"[1, 2]")[0] == 400
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.putrequest("POST", "/v1/completions")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(5 << 20))     # refused from the header, before the body is read
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and json.loads(resp.read())["error"]["type"] == "invalid_request_error"
    conn.close()
    with pytest.raises(openai.BadRequestError) as err:
        server.client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "x"}], top_p=-1)
    assert err.value.body["param"] == "top_p"
    assert server.client.models.list().data[0].id == "smol"


def test_a_client_that_leaves_mid_stream_frees_its_slot(server):
    for _ in range(6):          # more than max_batch_size (4): leaked slots would stall the last ones
        stream = server.client.completions.create(model="smol", prompt="Count: 1, 2,", max_tokens=200, temperature=0,
                                                  stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        stream.close()
    ok = server.client.completions.create(model="smol", prompt="Hi", max_tokens=3, temperature=0)
    assert ok.usage.completion_tokens == 3


def _scrape(server) -> dict:
    from trtllm_dflash.serving.metrics import parse
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/metrics", timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(resp.read().decode())


def _value(samples: dict, name: str, **labels) -> float:
    want = {"model_name": "smol", **{k: str(v) for k, v in labels.items()}}
    return sum(v for (n, lab), v in samples.items() if n == name and want.items() <= dict(lab).items())


def test_metrics_move_with_a_request(server):
    before = _scrape(server)
    reply = server.client.completions.create(model="smol", prompt="Count: 1, 2,", max_tokens=24, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True},
                                             stream_options={"include_usage": True})
    usage = [c for c in reply if c.usage][-1].usage
    after = _scrape(server)

    def delta(name, **labels):
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert delta("dflash:request_success_total", finished_reason="length") == 1
    assert delta("dflash:prompt_tokens_total") == usage.prompt_tokens
    assert delta("dflash:generation_tokens_total") == usage.completion_tokens == 24
    assert delta("dflash:time_to_first_token_seconds_count") == 1
    assert delta("dflash:e2e_request_latency_seconds_count") == 1
    drafts, steps = delta("dflash:spec_decode_num_drafts_total"), delta("dflash:inter_token_latency_seconds_count")
    assert drafts >= 1 and steps == drafts        # one update per DFlash step of this request
    # block 16 (fixed): 15 drafts per step; accepted + 1 bonus per step = the tokens after the prefill's first
    assert delta("dflash:spec_decode_num_draft_tokens_total") == 15 * drafts
    accepted = delta("dflash:spec_decode_num_accepted_tokens_total")
    assert accepted + drafts >= 24 - 1 and accepted + drafts <= 24 - 1 + 15
    assert delta("dflash:spec_decode_acceptance_length_count") == drafts
    assert delta("dflash:spec_decode_acceptance_length_sum") == accepted + drafts
    assert _value(after, "dflash:spec_decode_block") == 16
    assert delta("dflash:spec_decode_steps_by_block_total", block=16) >= drafts
    assert _value(after, "dflash:num_requests_running") == 0
    bucket = [v for (n, lab), v in after.items() if n == "dflash:time_to_first_token_seconds_bucket"
              and dict(lab)["le"] == "+Inf"]
    assert bucket == [_value(after, "dflash:time_to_first_token_seconds_count")]


def test_sweep_openai_equals_triton_on_the_same_prompts(server, smol_deployment, tmp_path):
    """dflash-sweep --server openai (written for trtllm-serve) against our server: the same token counts and
    acceptance as --server triton on the same prompts (greedy, fixed lengths)."""
    from tests.serving.conftest import start_server
    from trtllm_dflash.bench import sweep

    common = ["--engine", str(smol_deployment), "--concurrency", "2", "--num_requests", "4", "--warmup", "0",
              "--dataset", "humaneval", "--max_new_tokens", "8", "--ignore_eos"]
    assert sweep.main(["--server", "openai", "--url", f"127.0.0.1:{server.port}", *common,
                       "--out", str(tmp_path / "openai.jsonl")]) == 0
    triton = start_server(smol_deployment, tmp_path / "dflash-serve.log", timeout=300)
    try:
        assert sweep.main(["--server", "triton", "--url", triton.grpc, *common,
                           "--out", str(tmp_path / "triton.jsonl")]) == 0
    finally:
        assert triton.stop() == 0, triton.log_text()[-3000:]
    (o,), (t,) = ([json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
                  for name in ("openai", "triton"))
    for key in ("isl", "osl"):
        assert o["metrics"][key] == t["metrics"][key], key
    # dflash-openai counts the steps; Triton's counters leave them to block_size - 1 drafts a step (exact here: fixed)
    assert o["metrics"]["acceptance_source"] == "server_steps" and t["metrics"]["acceptance_source"] == "server_counters"
    assert o["metrics"]["acceptance_rate"] == pytest.approx(t["metrics"]["acceptance_rate"])
    assert o["metrics"]["acceptance_length_mean"] == pytest.approx(t["metrics"]["acceptance_length_mean"])


# ---- issue 25: what a hostile but legitimate client can hold -------------------------------------------------
def _timed_completion(server, max_tokens: int = 3) -> float:
    import time

    t0 = time.monotonic()
    ok = server.client.completions.create(model="smol", prompt="Hi", max_tokens=max_tokens, temperature=0)
    assert ok.usage.completion_tokens == max_tokens
    return time.monotonic() - t0


def test_non_streaming_clients_that_time_out_free_their_slots(server):
    """6 non-streaming requests (more than max_batch_size 4) whose clients give up after 0.5 s: their slots
    must be free within 1 s, so the next short request takes about its idle time (it used to wait for all
    of them: 11-12 s instead of 0.7 s)."""
    import time

    idle = _timed_completion(server)
    quick = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=0.5)
    for _ in range(6):
        with pytest.raises(openai.APITimeoutError):
            quick.completions.create(model="smol", prompt="Count: 1, 2,", max_tokens=400, temperature=0,
                                     extra_body={"ignore_eos": True})
    time.sleep(1.0)
    assert _timed_completion(server) < idle + 2.0     # 400 tokens x 4 slots would take far longer on CPU


def test_lone_surrogate_is_a_400_naming_the_field(server):
    code, err = server.post("/completions", b'{"model": "smol", "prompt": "a\\ud800b"}')
    assert code == 400 and err["error"]["param"] == "prompt" and "surrogate" in err["error"]["message"], err
    body = b'{"model": "smol", "messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\\udfff"}]}'
    code, err = server.post("/chat/completions", body)
    assert code == 400 and err["error"]["param"] == "messages[1].content", err
    assert _timed_completion(server) > 0


@pytest.mark.parametrize("path, key", [("/completions", "prompt"), ("/chat/completions", "messages[0].content")])
def test_a_huge_prompt_is_refused_by_size_before_tokenizing(server, path, key):
    """~4 MB of prompt (under the 4 MiB body bound) took 2.6 s and 3 GB to refuse once tokenized; its size
    alone says it cannot fit max_seq_len 512: refused at once, several at a time."""
    import concurrent.futures
    import time

    text = "word " * 800_000
    body = {"model": "smol", "prompt": text} if key == "prompt" else \
        {"model": "smol", "messages": [{"role": "user", "content": text}]}
    raw = json.dumps(body).encode()
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: server.post(path, raw), range(4)))
    assert time.monotonic() - t0 < 2.0
    for code, err in answers:
        assert code == 400 and err["error"]["param"] == key and "bytes" in err["error"]["message"], err
    assert _timed_completion(server) > 0


def test_sigterm_drain_is_bounded_and_every_client_gets_a_final_answer(smol_deployment, tmp_path):
    """--drain_timeout_s 1 with 2 streams and 1 non-streaming request running 400 tokens each: each client
    gets its final answer (an SSE error event then [DONE]; a 503 body) within the bound, and exit 0."""
    import http.client
    import signal
    import threading
    import time

    srv = OpenAIServer(smol_deployment, tmp_path / "drain.log", "smol", "--drain_timeout_s", "1")
    ended: dict[str, tuple[float, int, bytes]] = {}
    started = threading.Barrier(4)

    def one(name: str, stream: bool) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(
            {"model": "smol", "prompt": "Count: 1, 2,", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
             "stream": stream}), {"Content-Type": "application/json"})
        if stream:
            resp = conn.getresponse()
            resp.readline()           # the first event: it is running
            started.wait(120)
        else:
            started.wait(120)         # its answer comes only at the end
            resp = conn.getresponse()
        body = resp.read()
        ended[name] = (time.monotonic(), resp.status, body)

    threads = [threading.Thread(target=one, args=(f"s{i}", True)) for i in range(2)]
    threads.append(threading.Thread(target=one, args=("plain", False)))
    for t in threads:
        t.start()
    started.wait(120)
    time.sleep(1.0)                   # the non-streaming one is decoding too
    t_term = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    rc = srv.proc.wait(30)
    for t in threads:
        t.join(30)
    assert rc == 0, srv.log.read_text()[-3000:]
    assert time.monotonic() - t_term < 8.0
    for name in ("s0", "s1"):
        t_end, status, body = ended[name]
        assert status == 200 and t_end - t_term < 5.0
        assert b'"service_unavailable"' in body and body.rstrip().endswith(b"data: [DONE]"), body[-400:]
    t_end, status, body = ended["plain"]
    assert status == 503 and t_end - t_term < 5.0 and json.loads(body)["error"]["type"] == "service_unavailable"


def test_max_draft_len_0_serves_the_target_alone_with_the_same_tokens(server, smol_deployment, tmp_path):
    """--max_draft_len 0: the same deployment served without drafting (the AR baseline of an end-to-end sweep):
    no draft tokens counted, every step a block of 1, and greedy tokens equal to the DFlash server's."""
    ar = OpenAIServer(smol_deployment, tmp_path / "ar.log", "smol", "--max_draft_len", "0")
    try:
        def complete(srv):
            return srv.client.completions.create(model="smol", prompt="Count: 1, 2,", max_tokens=20, temperature=0,
                                                 extra_body={"ignore_eos": True}).choices[0].text

        assert complete(ar) == complete(server)
        samples = _scrape(ar)
        assert _value(samples, "dflash:spec_decode_num_draft_tokens_total") == 0
        assert _value(samples, "dflash:spec_decode_block") == 1
    finally:
        assert ar.stop() == 0, ar.log.read_text()[-3000:]


def test_max_draft_len_below_0_is_one_line(smol_deployment, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trtllm_dflash.serving.openai_server", str(smol_deployment),
                           "--max_draft_len", "-1"], capture_output=True, text=True, env=TEST_ENV, timeout=120)
    assert proc.returncode == 2
    assert "--max_draft_len" in proc.stderr and "pass 0 (no drafting) or more" in proc.stderr


# ---- #37 finding 10 and #35 item 13 ----------------------------------------------------------------------------
def test_many_messages_are_refused_before_templating(server):
    """100,000 empty messages (3 MB) were templated and tokenized to 500,025 tokens (2.1 s, +200 MB each)
    before the prompt bound refused them; a message count the template alone cannot fit is refused first."""
    import concurrent.futures
    import time

    raw = json.dumps({"model": "smol", "messages": [{"role": "user", "content": ""}] * 100_000}).encode()
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: server.post("/chat/completions", raw), range(4)))
    assert time.monotonic() - t0 < 2.0
    for code, err in answers:
        assert code == 400 and err["error"]["param"] == "messages" and "100000 entries" in err["error"]["message"], err
    # a conversation that fits still goes through
    ok = server.client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}] * 3,
                                               max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens == 2


@pytest.mark.parametrize("extra, param", [
    ({"n": True}, "n"), ({"n": 1.0}, "n"), ({"n": 2}, "n"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
])
def test_fields_that_were_silently_wrong_are_400(server, extra, param):
    body = {"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **extra}
    code, err = server.post("/chat/completions", json.dumps(body).encode())
    assert code == 400 and err["error"]["param"] == param, err
    code, err = server.post("/completions", json.dumps({"model": "smol", "prompt": "x", "suffix": "y"}).encode())
    assert code == 400 and err["error"]["param"] == "suffix", err


def test_a_max_tokens_error_names_max_tokens(server):
    # #35 item 13: the 400 named sampling_param_max_tokens (Triton's input), not the field the client sent
    code, err = server.post("/completions", json.dumps({"model": "smol", "prompt": "x", "max_tokens": 5000}).encode())
    assert code == 400 and err["error"]["param"] == "max_tokens", err
    assert err["error"]["message"].startswith("max_tokens: ") and "sampling_param" not in err["error"]["message"], err
    chat = {"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 5000}
    code, err = server.post("/chat/completions", json.dumps(chat).encode())
    assert code == 400 and err["error"]["param"] == "max_completion_tokens", err
    assert err["error"]["message"].startswith("max_completion_tokens: "), err


def test_clients_that_leave_mid_body_leave_no_traceback_and_cancels_are_counted(server):
    """1,000 clients leaving mid-body wrote 62,003 lines of tracebacks; cancelled requests were not in
    /metrics."""
    import socket
    import time

    before = server.log.read_text(errors="replace").count("Traceback")
    for _ in range(50):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"model\": ")
    quick = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        quick.completions.create(model="smol", prompt="Count: 1, 2,", max_tokens=400, temperature=0,
                                 extra_body={"ignore_eos": True})
    deadline = time.monotonic() + 10
    while True:
        text = urllib.request.urlopen(server.url.removesuffix("/v1") + "/metrics", timeout=10).read().decode()
        if 'finished_reason="cancelled"' in text:
            break
        assert time.monotonic() < deadline, "no cancelled request in /metrics"
        time.sleep(0.2)
    assert _timed_completion(server) > 0
    assert server.log.read_text(errors="replace").count("Traceback") == before, server.log.read_text()[-3000:]
