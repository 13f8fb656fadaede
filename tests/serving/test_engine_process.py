# SPDX-License-Identifier: Apache-2.0
"""The engine in a process of its own (serving/engine_core.py) behind EngineClient: requests checked at submit on
the frontend's side, results and usage as in-process, the same greedy tokens as the in-process runtime on a real
(tiny) model, and the failure rules: the engine process dies -> every request in flight ends with an error and
health turns False; the frontend dies -> the engine process ends; shutdown leaves no process behind. Then the
same through a real dflash-openai (uvicorn): a killed engine ends the streams with an error and /health says
503; SIGTERM drains and stops the engine."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.serving.conftest import TEST_ENV, free_port, terminate, wait_logged
from tests.serving.fakes import CharTokenizer
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving.engine_client import EngineClient
from trtllm_dflash.serving.record import ServedRequest, Unavailable


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
    return out


def _fake(factory: str = "FakeEngine") -> EngineClient:
    return EngineClient.spawn(".", engine_factory=f"tests.serving.fakes:{factory}", tokenizer=CharTokenizer(),
                              env=TEST_ENV)


def test_results_usage_stop_strings_and_checks_at_submit():
    engine = _fake()
    pid = engine.proc.pid
    try:
        records = [ServedRequest(prompt=f"r{i}", max_tokens=5, streaming=True) for i in range(6)]
        for record in records:
            engine.submit(record)
        for i, record in enumerate(records):
            got = list(record.results(timeout=30))
            final = got[-1]
            assert final.finished and final.finish_reason == "length" and not final.error
            assert "".join(r.text for r in got) == f"r{i}r{i}r"
            ids = [t for r in got for t in r.token_ids]
            assert "".join(map(chr, ids)) == f"r{i}r{i}r"                  # token ids are deltas
            assert final.num_prompt_tokens == 2 and final.num_output_tokens == 5 and final.num_draft_tokens > 0
            assert final.times_ns["arrival_time_ns"] <= final.times_ns["first_token_time_ns"] \
                <= final.times_ns["last_token_time_ns"]
        # A stop string is found here, on the reader's side, and frees the engine's slot.
        record = ServedRequest(prompt="abcdef", max_tokens=200, stop=("fa",))
        engine.submit(record)
        final = list(record.results(timeout=30))[-1]
        assert (final.finish_reason, final.stop_reason) == ("stop", "fa")
        deadline = time.monotonic() + 10
        while engine.metrics()["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        m = engine.metrics()
        assert m["running"] == 0 and m["live_requests"] == 0 and m["healthy"] == 1
        # Checked before anything is sent: the error names the input and nothing reaches the engine.
        steps = m["steps"]
        for bad, field in ((dict(top_p=2.0), "sampling_param_top_p"), (dict(max_tokens=10_000), "sampling_param_max_tokens"),
                           (dict(frequency_penalty=0.5), "sampling_param_frequency_penalty")):
            with pytest.raises(DFlashError, match=field):
                engine.submit(ServedRequest(prompt="x", **bad))
        assert engine.metrics()["steps"] == steps and engine.records() == []
        assert engine.health() == (True, "ok")
    finally:
        engine.shutdown()
    assert engine.proc.returncode == 0 and not _alive(pid)


def test_engine_process_death_fails_every_request_and_turns_unhealthy():
    engine = _fake("slow_engine")
    try:
        records = [ServedRequest(prompt=f"p{i}", max_tokens=200) for i in range(6)]   # 4 decode, 2 wait
        for record in records:
            engine.submit(record)
        assert records[0].get(timeout=30).token_ids      # decoding
        t0 = time.monotonic()
        os.kill(engine.proc.pid, signal.SIGKILL)
        for record in records:
            final = [r for r in record.results(timeout=10)][-1]
            assert final.finished and "engine process exited with code -9" in final.error, final
        assert time.monotonic() - t0 < 5
        ok, reason = engine.health()
        assert not ok and "exited with code -9" in reason
        assert engine.metrics()["healthy"] == 0 and engine.records() == []
        with pytest.raises(Unavailable, match="engine: is not serving"):
            engine.submit(ServedRequest(prompt="x", max_tokens=2))
    finally:
        engine.shutdown()


def test_a_broken_engine_tells_the_frontend_why_and_exits():
    engine = _fake("failing_engine")
    try:
        errors = []
        for _ in range(3):         # three failed steps in a row: broken
            record = ServedRequest(prompt="hi", max_tokens=4)
            engine.submit(record)
            errors.append(list(record.results(timeout=30))[-1].error)
        assert all("engine step failed: RuntimeError: device lost" in e for e in errors), errors
        assert engine.proc.wait(timeout=30) == 3
        deadline = time.monotonic() + 5
        while engine.health()[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        ok, reason = engine.health()
        assert not ok and "3 steps failed in a row" in reason, reason
    finally:
        engine.shutdown()


def test_the_engine_process_ends_with_its_frontend():
    """A frontend killed with SIGKILL cannot stop its engine: the engine sees its parent change and exits."""
    code = ("import sys, time; sys.path.insert(0, '.'); from tests.serving.test_engine_process import _fake; "
            "e = _fake('slow_engine'); print(e.proc.pid, flush=True); "
            "from trtllm_dflash.serving.record import ServedRequest; e.submit(ServedRequest(prompt='x', max_tokens=200)); "
            "time.sleep(60)")
    frontend = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=TEST_ENV)
    try:
        pid = int(frontend.stdout.readline())
        time.sleep(0.5)
        assert _alive(pid)
        frontend.kill()
        frontend.wait()
        assert _gone(pid, 5), "the engine process outlived its frontend"
    finally:
        frontend.kill()
        frontend.wait()


def test_several_frontends_share_one_engine_and_get_only_their_own_results():
    """Scale-out: a second client attaches by address (as dflash-openai --engine_address does)."""
    owner = _fake()
    other = EngineClient(owner.address, CharTokenizer(), ready_timeout_s=30)
    try:
        a = [ServedRequest(prompt=f"a{i}", max_tokens=6) for i in range(3)]
        b = [ServedRequest(prompt=f"b{i}", max_tokens=6) for i in range(3)]
        for x, y in zip(a, b):
            owner.submit(x)
            other.submit(y)
        for i, (x, y) in enumerate(zip(a, b)):
            assert "".join(r.text for r in x.results(timeout=30)) == f"a{i}a{i}a{i}"
            assert "".join(r.text for r in y.results(timeout=30)) == f"b{i}b{i}b{i}"
        other.shutdown()           # leaves: the engine keeps serving its owner
        record = ServedRequest(prompt="c", max_tokens=2)
        owner.submit(record)
        assert list(record.results(timeout=30))[-1].finish_reason == "length"
    finally:
        owner.shutdown()
    assert owner.proc.returncode == 0


class _HeldHandoff:
    """A frontend that takes every step in but acknowledges only when told (a sender busy sending)."""

    def __init__(self):
        self.steps, self.held = 0, []

    def deliver(self, updates):
        self.steps += 1
        for record, result in updates:
            record.push(result)

    def after(self, callback):
        self.held.append(callback)

    def release(self):
        held, self.held = self.held, []
        for callback in held:
            callback()


def _settled(handoff: _HeldHandoff, quiet_s: float = 0.5, timeout: float = 30) -> int:
    """Steps delivered once no more arrive for ``quiet_s``."""
    deadline, seen, since = time.monotonic() + timeout, -1, time.monotonic()
    while time.monotonic() < deadline:
        if handoff.steps != seen:
            seen, since = handoff.steps, time.monotonic()
        elif time.monotonic() - since > quiet_s:
            return seen
        time.sleep(0.02)
    raise AssertionError("the engine never paused for the unacknowledged frontend")


def test_the_engine_runs_at_most_max_unacked_steps_ahead_of_a_frontend():
    """Flow control: a frontend still sending runs its engine MAX_UNACKED steps ahead, no more (bounded memory and
    latency), and acknowledging lets it go on at once. The bound is what lets a frontend that pays per response
    (Triton's python stub) keep up by sending fewer, larger responses while the engine keeps stepping. The time
    held back with work waiting is counted (frontend_held_ms in the stats; logged when the engine process ends)."""
    from trtllm_dflash.serving.engine_core import MAX_UNACKED

    engine = _fake()
    handoff = _HeldHandoff()
    try:
        record = ServedRequest(prompt="ab", max_tokens=4 * MAX_UNACKED + 20, streaming=True)
        record.handoff = handoff
        engine.submit(record)
        assert _settled(handoff) == MAX_UNACKED          # the prefill's step counts like any other
        time.sleep(0.3)                                  # held back, with work: counted for the run's summary
        assert engine.metrics()["frontend_held_ms"] >= 250
        handoff.release()
        assert _settled(handoff) == 2 * MAX_UNACKED
        while not record.finished:
            handoff.release()
            time.sleep(0.02)
        assert sum(len(r.token_ids) for r in record.results(timeout=0)) == 4 * MAX_UNACKED + 20
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_greedy_tokens_equal_the_in_process_runtime(tiny_deployment):
    from trtllm_dflash.deployment import Deployment
    from trtllm_dflash.serving.runtimes import TorchRuntime

    prompts = ["The sea is", "def add(a, b):", "1, 2, 3,"]

    def run(backend) -> list[list[int]]:
        records = [ServedRequest(prompt=p, max_tokens=12, ignore_eos=True, temperature=0.0) for p in prompts]
        for record in records:
            backend.submit(record)
        return [[t for r in record.results(timeout=120) for t in r.token_ids] for record in records]

    inproc = TorchRuntime.from_deployment(Deployment.open(tiny_deployment))
    try:
        want = run(inproc)
    finally:
        inproc.shutdown()
    engine = EngineClient.spawn(tiny_deployment, env=TEST_ENV)
    try:
        assert engine.info.vocab_size > 0 and engine.max_seq_len == inproc.max_seq_len
        assert run(engine) == want and all(len(w) == 12 for w in want)
    finally:
        engine.shutdown()
    assert not _children(os.getpid()) or all(not _alive(p) for p in _children(os.getpid()))


# ---- through a real dflash-openai (uvicorn) -----------------------------------------------------------------
def _one_frontend_unless_asked(extra: tuple) -> tuple:
    """--api_server_count's default follows the machine's cores: these tests count the server's children."""
    return extra if any(a.startswith("--api_server") for a in extra) else (*extra, "--api_server_count", "1")


class _OpenAI:
    def __init__(self, deployment_dir, log, *extra, children: int = 1, own_group: bool = False):
        self.port, self.log = free_port(), log
        cmd = [sys.executable, "-m", "trtllm_dflash.serving.openai_server", str(deployment_dir), "--port", str(self.port),
               "--served_model_name", "m", *_one_frontend_unless_asked(extra)]
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=TEST_ENV,
                                         start_new_session=own_group)   # own_group: a terminal's process group
        wait_logged(self.proc, log, "dflash-openai: ready", 180, stop_timeout=30)
        self.url = f"http://127.0.0.1:{self.port}"
        engines = [p for p in _children(self.proc.pid) if _alive(p)]
        assert len(engines) == children, engines     # the engine (and the API servers of --api_server_count)
        self.engine_pid = engines[0] if children == 1 else None

    def health(self) -> int:
        try:
            return urllib.request.urlopen(self.url + "/health", timeout=10).status
        except urllib.error.HTTPError as err:
            return err.code

    def stream(self, max_tokens: int = 240):
        body = json.dumps({"model": "m", "prompt": "Count: 1, 2,", "max_tokens": max_tokens, "ignore_eos": True,
                           "stream": True}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=60)


@pytest.mark.slow
def test_openai_server_engine_killed_mid_stream(tiny_deployment, tmp_path):
    srv = _OpenAI(tiny_deployment, tmp_path / "openai.log")
    try:
        assert srv.health() == 200
        resp = srv.stream()
        assert resp.readline().startswith(b"data: ")           # it is running
        os.kill(srv.engine_pid, signal.SIGKILL)
        rest = resp.read()
        assert b"engine process exited with code -9" in rest and rest.rstrip().endswith(b"data: [DONE]"), rest[-500:]
        assert srv.health() == 503
        try:
            code = srv.stream().status
        except urllib.error.HTTPError as err:
            code = err.code
        assert code == 503
    finally:
        assert terminate(srv.proc, 30) == 0, srv.log.read_text()[-3000:]


@pytest.mark.slow
def test_openai_server_sigterm_drains_and_stops_its_engine(tiny_deployment, tmp_path):
    srv = _OpenAI(tiny_deployment, tmp_path / "openai.log", "--drain_timeout_s", "2")
    resp = srv.stream(max_tokens=10_000 // 50)
    assert resp.readline().startswith(b"data: ")
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    body = resp.read()
    assert body.rstrip().endswith(b"data: [DONE]") and time.monotonic() - t0 < 2 + 1   # within the drain bound
    assert srv.proc.wait(timeout=30) == 0, srv.log.read_text()[-3000:]
    assert time.monotonic() - t0 < 8      # as test_openai_server's drain test: the interpreter's exit after it
    assert _gone(srv.engine_pid, 5), "the engine process outlived dflash-openai"


# ---- through a real tritonserver (dflash-serve) --------------------------------------------------------------
def _engines_under(pid: int) -> list[int]:
    """Engine processes among the descendants of ``pid`` (the Triton model's stub starts one)."""
    found, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            todo.append(child)
            try:
                cmd = open(f"/proc/{child}/cmdline", "rb").read()
            except FileNotFoundError:
                continue
            if b"trtllm_dflash.serving.engine_core" in cmd and _alive(child):
                found.append(child)
    return found


@pytest.mark.slow
def test_triton_engine_killed_mid_stream_ends_the_streams_and_dflash_serve_restarts(tiny_deployment, tmp_path):
    """The Triton model's engine process dies under running streams: each stream ends with the error, the model
    reports broken and dflash-serve restarts the server (a new engine), which serves; its stop leaves no engine."""
    from tests.serving.conftest import start_server
    from tests.serving.test_server import _ready, _streams_in_flight, _wait_restarted

    srv = start_server(tiny_deployment, tmp_path / "dflash-serve.log", "--max_restarts", "1")
    new = None
    try:
        (engine,) = _engines_under(srv.proc.pid)
        outcomes, threads, started = _streams_in_flight(srv, 4)
        assert started.wait(60), "no stream started"
        os.kill(engine, signal.SIGKILL)
        for t in threads:
            t.join(30)
        assert sorted(outcomes) == list(range(4)), srv.log_text()[-3000:]
        for kind, detail, _ in outcomes.values():
            assert kind == "error" and "engine process exited with code -9" in detail, (kind, detail)
        _wait_restarted(srv, 1)
        assert "the model reports engine: the engine process exited with code -9" in srv.log_text()
        (new,) = _engines_under(srv.proc.pid)
        assert new != engine and _ready(srv) == 200
        from trtllm_dflash.serving import client
        assert client.collect(client.generate_http(srv.http, client.build_inputs("hi", max_tokens=4)))[
            "finish_reason"] == "length"
    finally:
        assert srv.stop() == 0, srv.log_text()[-3000:]
    assert new is not None and _gone(new, 10), "dflash-serve's stop left the engine process running"


@pytest.mark.slow
def test_triton_sigkill_of_dflash_serve_leaves_no_engine_process(tiny_deployment, tmp_path):
    """dflash-serve is SIGKILLed while tritonserver hangs (stopped here; in the field, a crash at unload whose
    zombie a container's init never reaps looks the same to the stub: its parent still exists). Nobody will unload
    the model, so the stub must leave by itself, and the engine process with it."""
    import ctypes
    from tests.serving.conftest import start_server
    from tests.serving.test_server import _streams_in_flight
    from trtllm_dflash.serving.server import shm_regions

    def _ppid(pid):
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])

    srv = start_server(tiny_deployment, tmp_path / "dflash-serve.log")
    libc = ctypes.CDLL(None, use_errno=True)
    tritonserver = None
    try:
        (engine,) = _engines_under(srv.proc.pid)
        _, threads, started = _streams_in_flight(srv, 2)
        assert started.wait(60), "no stream started"
        stub = _ppid(engine)                 # the engine's parent: the model
        tritonserver = _ppid(stub)
        regions = shm_regions(tritonserver)
        assert regions, "the python backend's shared memory was not found"
        assert libc.prctl(36, 1) == 0        # PR_SET_CHILD_SUBREAPER: the orphaned tritonserver becomes ours
        os.kill(tritonserver, signal.SIGSTOP)
        srv.proc.kill()
        srv.proc.wait()
        for t in threads:
            t.join(30)
        assert _gone(stub, 60), "the Triton model's stub process outlived dflash-serve and tritonserver"
        assert _gone(engine, 5), "the engine process outlived its frontend (the Triton model's stub)"
        # the stub was killed: neither Triton nor dflash-serve will remove its shared memory, the engine did
        assert not [r for r in regions if r.exists()], "the killed stub's shared memory is left in /dev/shm"
    finally:
        libc.prctl(36, 0)
        srv.stop(10)
        if tritonserver is not None:
            try:
                os.kill(tritonserver, signal.SIGKILL)
                os.waitpid(tritonserver, 0)      # reap the zombie this test adopted
            except (ProcessLookupError, ChildProcessError):
                pass
