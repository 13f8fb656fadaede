# SPDX-License-Identifier: Apache-2.0
"""dflash-openai --api_server_count: several API server processes on one port, one engine process behind them
(serving/api_servers.py). /metrics sums the request-level series of every API server; a real server on the tiny
deployment answers with the same greedy tokens as one process, counts every token once, and stops cleanly: on
SIGTERM every process ends and nothing is left behind; an API server that dies takes the whole server down."""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import time
import urllib.request
from types import SimpleNamespace

import pytest

from tests.serving.conftest import terminate
from tests.serving.test_engine_process import _OpenAI, _alive, _children, _gone
from trtllm_dflash.serving.api_servers import MetricsBoard
from trtllm_dflash.serving import metrics as serving_metrics
from trtllm_dflash.serving.metrics import ServingMetrics, parse
from trtllm_dflash.serving.record import Result


def _serve(metrics: ServingMetrics, tokens: int, reason: str = "length") -> None:
    """One request through ``metrics``: ``tokens`` updates of one token each, then its end."""
    record = SimpleNamespace(num_prompt_tokens=3)
    metrics.start(record)
    for n in range(1, tokens + 1):
        metrics.observe(record, Result(num_output_tokens=n, num_prompt_tokens=3, num_draft_tokens=2 * n,
                                       num_accepted_draft_tokens=n, finished=n == tokens, finish_reason=reason))


def _samples(text: str) -> dict:
    return {(name, labels): v for (name, labels), v in parse(text).items()
            if not name.endswith("_sum")}     # sums are of wall times: not comparable between objects


def test_render_sums_the_peers_series_as_one_frontend_would(tmp_path, monkeypatch):
    # a clock that moves 0.1 ms per reading: the latency histograms of `a`/`b` and `both` see the same gaps (with
    # the wall clock a busy machine put one gap of a request on either side of a bucket's edge in one of them)
    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(serving_metrics, "time", SimpleNamespace(monotonic=lambda: 1e-4 * next(ticks)))
    a, b, both = ServingMetrics("m"), ServingMetrics("m"), ServingMetrics("m")
    for metrics, work in ((a, [(4, "length"), (2, "stop")]), (b, [(5, "length")])):
        for tokens, reason in work:
            _serve(metrics, tokens, reason)
            _serve(both, tokens, reason)
    engine = {"running": 0, "waiting": 0, "steps": 7}
    board_a, board_b = MetricsBoard(tmp_path, 0), MetricsBoard(tmp_path, 1)
    board_a.publish(a.snapshot())
    board_b.publish(b.snapshot())
    assert board_a.peers() == [json.loads(json.dumps(b.snapshot()))] and board_b.peers() == [a.snapshot()]
    merged = _samples(a.render(engine, board_a.peers()))
    assert merged == _samples(both.render(engine)), set(merged.items()) ^ set(_samples(both.render(engine)).items())
    assert merged[("dflash:generation_tokens_total", (("model_name", "m"),))] == 11
    assert merged[("dflash:engine_steps_total", (("model_name", "m"),))] == 7     # the one engine's: not summed
    assert _samples(a.render(engine)) != merged


def _complete(port: int, i: int) -> dict:
    body = json.dumps({"model": "m", "prompt": f"Count to {i}:", "max_tokens": 16, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())


def _texts(srv, n: int) -> list[str]:
    with cf.ThreadPoolExecutor(8) as pool:
        return [r["choices"][0]["text"] for r in pool.map(lambda i: _complete(srv.port, i), range(n))]


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            if _alive(child):
                found.append(child)
                todo.append(child)
    return found


@pytest.mark.slow
def test_two_api_servers_answer_like_one_and_stop_cleanly(tiny_deployment, tmp_path):
    one = _OpenAI(tiny_deployment, tmp_path / "one.log")
    try:
        want = _texts(one, 12)
    finally:
        assert terminate(one.proc, 30) == 0, one.log.read_text()[-3000:]
    srv = _OpenAI(tiny_deployment, tmp_path / "two.log", "--api_server_count", "2", "--drain_timeout_s", "2",
                  children=3)
    try:
        assert "2 API servers" in srv.log.read_text()
        procs = _descendants(srv.proc.pid)
        assert len(procs) == 3, procs           # two API servers and the engine
        assert _texts(srv, 12) == want
        time.sleep(1.5)                         # every API server has published its series since
        text = urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10).read().decode()
        got = parse(text)
        assert got[("dflash:generation_tokens_total", (("model_name", "m"),))] == 12 * 16
        assert got[("dflash:request_success_total", (("finished_reason", "length"), ("model_name", "m")))] == 12
        argv = open(f"/proc/{procs[0]}/cmdline", "rb").read().split(b"\0")
        if b"--metrics_dir" not in argv:
            argv = open(f"/proc/{procs[1]}/cmdline", "rb").read().split(b"\0")
        board = argv[argv.index(b"--metrics_dir") + 1].decode()
        assert sorted(os.listdir(board)) == ["frontend-0.json", "frontend-1.json", "ready-0", "ready-1"]
    finally:
        t0 = time.monotonic()
        assert terminate(srv.proc, 30) == 0, srv.log.read_text()[-3000:]
    assert time.monotonic() - t0 < 15
    assert all(_gone(p, 5) for p in procs), [p for p in procs if _alive(p)]
    assert not os.path.exists(board)


@pytest.mark.slow
def test_an_api_server_that_dies_takes_the_server_down(tiny_deployment, tmp_path):
    srv = _OpenAI(tiny_deployment, tmp_path / "srv.log", "--api_server_count", "2", "--drain_timeout_s", "1",
                  children=3)
    procs = _descendants(srv.proc.pid)
    workers = [p for p in procs if b"openai_server" in open(f"/proc/{p}/cmdline", "rb").read()]
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    assert srv.proc.wait(timeout=30) == 1
    assert "an API server exited with code -9" in srv.log.read_text()
    assert all(_gone(p, 10) for p in procs), [p for p in procs if _alive(p)]


def test_bad_settings_are_one_line(tiny_deployment, capsys):
    from trtllm_dflash.cli import openai_main

    assert openai_main([str(tiny_deployment), "--api_server_count", "0"]) != 0
    err = capsys.readouterr().err
    assert "--api_server_count: is 0" in err and "pass 1 or more" in err
    # an engine the API servers attach to is not theirs to configure: refused before anything starts
    from tests.serving.conftest import free_port
    assert openai_main([str(tiny_deployment), "--api_server_count", "2", "--port", str(free_port()),
                        "--engine_address", "ipc://@nobody", "--max_draft_len", "0"]) != 0
    assert "changes an engine this server starts, not one it attaches to" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_drains_every_api_server(tiny_deployment, tmp_path):
    """SIGINT to the whole process group (a terminal's Ctrl-C): the running stream still ends with [DONE], the
    server exits 0 and no process is left (the API servers, in sessions of their own, hear it from the parent)."""
    srv = _OpenAI(tiny_deployment, tmp_path / "srv.log", "--api_server_count", "2", "--drain_timeout_s", "2",
                  children=3, own_group=True)
    procs = _descendants(srv.proc.pid)
    body = json.dumps({"model": "m", "prompt": "Count:", "max_tokens": 200, "ignore_eos": True,
                       "stream": True}).encode()
    resp = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{srv.port}/v1/completions", data=body,
                                                         headers={"Content-Type": "application/json"}), timeout=60)
    assert resp.readline().startswith(b"data: ")
    os.killpg(srv.proc.pid, signal.SIGINT)
    assert resp.read().rstrip().endswith(b"data: [DONE]")
    assert srv.proc.wait(timeout=30) == 0, srv.log.read_text()[-3000:]
    assert all(_gone(p, 10) for p in procs), [p for p in procs if _alive(p)]



def test_the_default_count_follows_the_cores(monkeypatch):
    from trtllm_dflash.serving import openai_server

    for cores, want in ((1, 1), (2, 1), (7, 1), (8, 2), (16, 4), (128, 4)):
        monkeypatch.setattr(openai_server.os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert openai_server.default_api_server_count() == want, cores
