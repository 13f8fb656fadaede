# SPDX-License-Identifier: Apache-2.0
"""dflash-sweep end to end: the in-process engine (AR and DFlash, one code path), an OpenAI-compatible
endpoint (a local fake trtllm-serve), a real Triton server on the demo deployment, and TP ranks under mpiexec."""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.bench.conftest import REPO, check_row, in_a_process_of_its_own, read_rows
from trtllm_dflash.bench import plot, sweep
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.provenance import checkpoint_digest

FAST = ["--num_requests", "4", "--max_new_tokens", "8", "--input_len", "8", "--ignore_eos"]


def test_parse_concurrency():
    assert sweep.parse_concurrency("8,1, 2,2") == [1, 2, 8]
    for bad in ("", "0,1", "a,b", "-1"):
        with pytest.raises(DFlashError, match="--concurrency: .* is not a list of positive integers"):
            sweep.parse_concurrency(bad)


def test_engine_ar_and_dflash_rows(tiny_engine_dir, tmp_path, capsys):
    out = tmp_path / "sweep.jsonl"
    # The manifest's max_batch_size is 8: the engine is built with max(concurrency) = 10 slots instead.
    for mode in ("ar", "dflash"):
        assert sweep.main(["--engine", str(tiny_engine_dir), "--mode", mode, "--concurrency", "2,10", *FAST,
                           "--num_requests", "10", "--out", str(out)]) == 0
    assert "AR c=10:" in capsys.readouterr().out
    rows = read_rows(out)
    assert [(r["label"], r["settings"]["concurrency"]) for r in rows] == [("AR", 2), ("AR", 10), ("DFlash", 2),
                                                                          ("DFlash", 10)]
    for row in rows:
        check_row(row, row["settings"]["concurrency"])
        s, m = row["settings"], row["metrics"]
        assert s["max_batch_size"] == 10 and s["device"] == "cpu" and s["dtype"] == "float32" and s["tp_size"] == 1
        assert s["server"] == "engine" and s["dataset"] == "random" and s["input_len"] == 8
        assert m["osl"] == {"mean": 8.0, "min": 8, "max": 8} and m["isl"]["mean"] == 8.0    # --ignore_eos
        assert m["finish_reasons"] == {"length": 10} and m["acceptance_source"] == "runtime"
        assert row["command"].startswith("dflash-sweep --engine") and row["versions"]["torch"]
        prov = row["provenance"]   # the sha256s are the deployment folders' own, as provenance computes them
        assert prov["command"] == row["command"] and prov["git"]["sha"]
        for role in ("target", "drafter"):
            assert prov["checkpoints"][role]["sha256"] == checkpoint_digest(tiny_engine_dir / role)["sha256"]
    ar, df = rows[0], rows[2]
    # same engine, same prompts: AR is block_size 1 (acceptance exactly 1), DFlash the manifest's block 8
    assert ar["settings"]["block_size"] == 1 and ar["metrics"]["acceptance_histogram"] == {"1": 70}
    assert df["settings"]["block_size"] == 8 and df["metrics"]["acceptance_rate"] is not None
    assert ar["settings"]["batch_invariant"] is False     # the deployment's numerics mode, so two builds compare
    assert ar["metrics"]["tokens_per_chunk_mean"] == 1.0
    assert plot.main([str(out), "--out_dir", str(tmp_path)]) == 0
    assert (tmp_path / "pareto.png").stat().st_size > 10_000
    assert "### DFlash vs AR" in (tmp_path / "iso_interactivity.md").read_text()


def test_engine_packaged_prompts(tiny_engine_dir, tmp_path):
    out = tmp_path / "mt.jsonl"
    assert sweep.main(["--engine", str(tiny_engine_dir), "--dataset", "mtbench", "--concurrency", "2",
                       "--num_requests", "2", "--warmup", "0", "--max_new_tokens", "4", "--label", "mt",
                       "--out", str(out)]) == 0
    (row,) = read_rows(out)
    assert row["label"] == "mt" and row["settings"]["dataset"] == "mtbench" and row["settings"]["warmup"] == 0
    assert row["metrics"]["isl"]["min"] > 20          # chat template + a real MT-Bench question
    # A max_seq_len too small for any prompt is refused up front, naming the knob.
    with pytest.raises(DFlashError, match="--max_new_tokens: no prompt fits: max_seq_len 256"):
        sweep.main(["--engine", str(tiny_engine_dir), "--dataset", "mtbench", "--max_new_tokens", "240",
                    "--concurrency", "1", "--out", str(out)])


def test_cli_errors_are_one_line(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "trtllm_dflash.bench.sweep", *args, "--out", str(tmp_path / "x")],
                              capture_output=True, text=True, timeout=120)
    for args, message in [((), "error: --deployment_dir: missing"),
                          (("--deployment_dir", str(tmp_path)), "has no manifest.json"),
                          (("--server", "triton"), "error: --url: missing for --server triton"),
                          (("--concurrency", "0"), "error: --concurrency:")]:
        res = run(*args)
        assert res.returncode == 2 and message in res.stderr and res.stderr.count("\n") == 1, (args, res.stderr)
    assert not (tmp_path / "x").exists()


def test_the_old_backend_flag_still_picks_the_server():
    # "backend" names only a deployment's runtime now; scripts that type dflash-sweep --backend keep working
    out = ["--out", "x.jsonl"]
    assert sweep.parse_args(["--backend", "openai", *out]).server == "openai"
    assert sweep.parse_args(["--server", "triton", *out]).server == "triton"
    assert sweep.parse_args(out).server == "engine"


# ---- OpenAI-compatible endpoint: a local fake of trtllm-serve's /v1/completions stream --------------------

class FakeOpenAI(BaseHTTPRequestHandler):
    """Streams 2 tokens per chunk (like a speculative decoder), with usage in every chunk."""

    bodies: list[dict] = []
    live = peak = 0
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._send(200, {"data": [{"id": "fake-model"}]})

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.bodies.append(body)
            cls.live += 1
            cls.peak = max(cls.peak, cls.live)
        left = [True]

        # Uncount this request before the client can see its end: the client may send its next request at once,
        # and that request's handler must not find this one still counted (a 4th "in flight" on a loaded box).
        def leave():
            with cls.lock:
                if left[0]:
                    cls.live -= 1
                    left[0] = False
        try:
            if not body["stream"]:
                leave()
                self._send(200, {"choices": [{"text": " tok" * body["max_tokens"], "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": 7, "completion_tokens": body["max_tokens"]}})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            n, sent = body["max_tokens"], 0
            while sent < n:
                time.sleep(0.01)
                k = min(2, n - sent)
                sent += k
                if sent == n:
                    leave()
                chunk = {"choices": [{"text": " tok" * k, "finish_reason": "length" if sent == n else None}],
                         "usage": {"prompt_tokens": 7, "completion_tokens": sent}}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": %d}}\n\n' % n)
            self.wfile.write(b"data: [DONE]\n\n")
        finally:
            leave()


@contextlib.contextmanager
def fake_openai():
    """FakeOpenAI on a free port, its record of requests emptied: yields host:port."""
    FakeOpenAI.bodies, FakeOpenAI.peak, FakeOpenAI.live = [], 0, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def test_openai_endpoint_closed_loop(tmp_path, smollm2_dir):
    out = tmp_path / "openai.jsonl"
    with fake_openai() as url:
        assert sweep.main(["--server", "openai", "--url", url, "--tokenizer",
                           str(smollm2_dir), "--label", "EAGLE-3", "--tp_size", "2", "--block_size", "4",
                           "--concurrency", "3", "--num_requests", "9", "--warmup", "0", "--max_new_tokens", "9",
                           "--ignore_eos", "--dataset", "random", "--input_len", "16", "--out", str(out)]) == 0
        one = tmp_path / "unstreamed.jsonl"
        assert sweep.main(["--server", "openai", "--url", url, "--tokenizer",
                           str(smollm2_dir), "--no_streaming", "--concurrency", "2", "--num_requests", "2",
                           "--warmup", "0", "--max_new_tokens", "5", "--out", str(one)]) == 0
    (unstreamed,) = read_rows(one)
    m = unstreamed["metrics"]
    assert m["osl"]["mean"] == 5.0 and m["tok_s_user"] is None and m["tok_s_user_e2e"] > 0   # no TPOT without a stream
    assert m["ttft_ms"]["p50"] <= m["e2e_ms"]["p50"] and m["itl_chunk_ms"]["mean"] is None
    assert FakeOpenAI.bodies[-1]["stream"] is False and "stream_options" not in FakeOpenAI.bodies[-1]
    del FakeOpenAI.bodies[9:]
    (row,) = read_rows(out)
    check_row(row, 3)
    s, m = row["settings"], row["metrics"]
    assert FakeOpenAI.peak == 3 and len(FakeOpenAI.bodies) == 9          # closed loop: 3 in flight, never more
    body = FakeOpenAI.bodies[0]
    assert body["model"] == "fake-model" and body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert s["model"] == "fake-model" and s["num_gpus"] == 2 and s["target"] == str(smollm2_dir)
    assert m["osl"]["mean"] == 9.0 and m["isl"]["mean"] == 7.0            # the server's usage, not a re-count
    assert m["acceptance_source"] == "stream_chunks" and m["acceptance_histogram"] == {"1": 9, "2": 27}
    assert m["tok_s_gpu"] == pytest.approx(m["total_tok_s"] / 2)


# ---- a real tritonserver on the demo deployment (dflash-build --config build_configs/smollm2-...) ---------

@pytest.mark.exhaustive   # ~43 s; test_sweep_openai_equals_triton_on_the_same_prompts sweeps a real tritonserver too
def test_triton_sweep_of_the_demo_deployment(demo_engine_dir, tmp_path):
    from tests.serving.conftest import start_server

    t0 = time.monotonic()
    srv = start_server(demo_engine_dir, tmp_path / "dflash-serve.log", timeout=180)
    out = tmp_path / "triton.jsonl"
    try:
        with pytest.raises(DFlashError, match="--concurrency: 64 > the deployment's max_batch_size 4"):
            sweep.main(["--server", "triton", "--url", srv.grpc, "--engine", str(demo_engine_dir),
                        "--concurrency", "1,64", "--out", str(out)])
        # our Triton model adds sampling_param_ignore_eos to TensorRT-LLM's inputs, so fixed-length runs work
        assert sweep.main(["--server", "triton", "--url", srv.grpc, "--engine", str(demo_engine_dir),
                           "--concurrency", "1,2", "--num_requests", "2", "--warmup", "1", "--dataset", "humaneval",
                           "--max_new_tokens", "6", "--ignore_eos", "--out", str(out)]) == 0
    finally:
        assert srv.stop() == 0, srv.log_text()[-3000:]
    rows = read_rows(out)
    assert [r["settings"]["concurrency"] for r in rows] == [1, 2]
    for row in rows:
        check_row(row, row["settings"]["concurrency"])
        s, m = row["settings"], row["metrics"]
        assert s["server"] == "triton" and s["model"] == "tensorrt_llm" and s["dataset"] == "humaneval"
        assert s["block_size"] == 16 and s["drafter"] == "smollm2-135m-dflash" and not s["drafter_untrained"] and s["target"] == "packaged:smollm2-135m"
        assert s["gpu_profile"] == "cpu" and s["gpu_name"] is None
        # the demo deployment runs the adaptive policy (CPU): its steps' blocks vary, so the server's draft counters
        # do not give the step count; tokens per streamed chunk do
        assert s["draft_policy"] == "adaptive" and m["acceptance_source"] == "stream_chunks"
        if m["acceptance_rate"] is None:        # no step drafted: one token per step
            assert set(m["acceptance_histogram"]) == {"1"}
        else:
            assert 0.0 <= m["acceptance_rate"] <= 1.0
        assert m["isl"]["min"] > 100 and 1 <= m["osl"]["mean"] <= 6
        assert m["itl_chunk_ms"]["mean"] > 0 and m["ttft_ms"]["p50"] > 0
    assert plot.main([str(out), "--out_dir", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "pareto.png").stat().st_size > 10_000
    print(f"triton sweep test: {time.monotonic() - t0:.1f} s (server ready in {srv.ready_s:.1f} s)")


# ---- tensor parallelism: rank 0 drives, rank 1 follows, under a real mpiexec -------------------------------

def mpiexec() -> str:
    exe = Path(sys.executable).parent / "mpiexec"
    return str(exe) if exe.exists() else "mpiexec"


@pytest.mark.mpi
@pytest.mark.exhaustive   # tests/bench/test_scripts.py runs the mpirun sweep recipe (TP 2) by default
def test_tp2_engine_sweep_under_mpiexec(tiny_target_with_tokenizer, tmp_path):
    from tests.serving.conftest import make_deployment

    dep = make_deployment(tmp_path / "tp2", *tiny_target_with_tokenizer, tp_size=2, fill=False)
    out = tmp_path / "tp2.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "trtllm_dflash.bench.sweep", "--engine", str(dep),
           "--concurrency", "1,2", *FAST, "--out", str(out)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = read_rows(out)
    assert [r["settings"]["concurrency"] for r in rows] == [1, 2]          # rank 0 only wrote
    for row in rows:
        check_row(row, row["settings"]["concurrency"])
        assert row["settings"]["tp_size"] == row["settings"]["num_gpus"] == 2
        assert row["metrics"]["tok_s_gpu"] == pytest.approx(row["metrics"]["total_tok_s"] / 2)


def test_openai_endpoint_over_client_processes(tmp_path, smollm2_dir):
    """--client_processes 3: three spawned clients share the level, each with its own HTTP client and tokenizer;
    still a closed loop of 3 in flight, every request once with its own seed, one row."""
    out = tmp_path / "procs.jsonl"
    with fake_openai() as url:
        run = in_a_process_of_its_own([
            "-m", "trtllm_dflash.bench.sweep", "--server", "openai", "--url", url, "--tokenizer", str(smollm2_dir),
            "--client_processes", "3", "--block_size", "4", "--concurrency", "3", "--num_requests", "9", "--warmup",
            "0", "--max_new_tokens", "6", "--ignore_eos", "--dataset", "random", "--input_len", "16", "--seed", "100",
            "--out", str(out)])
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = read_rows(out)
    check_row(row, 3)
    assert row["settings"]["client_processes"] == 3 and row["metrics"]["num_requests"] == 9
    assert row["metrics"]["num_errors"] == 0 and row["metrics"]["osl"]["mean"] == 6.0
    assert FakeOpenAI.peak <= 3 and sorted(b["seed"] for b in FakeOpenAI.bodies) == list(range(100, 109))


def test_client_processes_auto_and_refusals(tmp_path, monkeypatch):
    from trtllm_dflash.bench import drivers
    monkeypatch.setattr(drivers.os, "cpu_count", lambda: 16)
    assert [drivers.client_processes(0, c) for c in (1, 32, 33, 64, 256)] == [1, 1, 2, 2, 4]
    assert drivers.client_processes(3, 8) == 3 and drivers.client_processes(3, 2) == 2   # never more than in flight
    monkeypatch.setattr(drivers.os, "cpu_count", lambda: 2)
    assert drivers.client_processes(0, 256) == 1
    with pytest.raises(DFlashError, match="--client_processes"):
        sweep.parse_args(["--client_processes", "-1", "--out", str(tmp_path / "x.jsonl")])


def test_a_client_process_that_cannot_start_fails_the_level_with_its_reason(smollm2_dir):
    script = f"""
import functools
from trtllm_dflash.bench import drivers
from trtllm_dflash.bench.endpoints import open_client
from trtllm_dflash.bench.workload import WorkItem
# port 9: nothing listens, so listing the models fails
make = functools.partial(open_client, "openai", "127.0.0.1:9", {str(smollm2_dir)!r}, max_tokens=4, temperature=0.0,
                         seed=0, ignore_eos=True)
try:
    drivers.run_process_level(make, [WorkItem((1, 2), "hi")] * 4, 2, 2)
except RuntimeError as err:
    print(err)
"""
    t0 = time.perf_counter()
    run = in_a_process_of_its_own(["-c", script])
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"client process . of 2 failed: DFlashError: --url: cannot list models", run.stdout), run.stdout
    assert time.perf_counter() - t0 < 120   # the other process is released from the start barrier, no hang
