# SPDX-License-Identifier: Apache-2.0
"""How fast can a decoupled python-backend model send responses, and what does a busy thread beside the sender
cost it? The ceiling under the Triton model's sender thread (serving/triton_model.py), measured alone.

    python -m trtllm_dflash.bench.triton_send_rate --out benchmarks/results/triton_send_rate_cpu.json

A real tritonserver (NGC's on PATH, else nvidia-pytriton's) serves a throw-away repository with one decoupled
python model. Per case, one gRPC stream asks it for ``--sends`` responses: a thread in the stub sends them one
after another with ``response_sender.send`` while, in the same process, a second Python thread is busy for
``busy_fraction`` of the time (spinning ``--busy_us`` at a time, sleeping the rest) under the stub's GIL switch
interval ``interval_ms``. The stub times the sends itself (the client only counts them), so the figure is the
python backend's rate, not the client's.

Why: ``send`` lets the GIL go while Triton takes the response over, and has to get it back before the next one.
When another thread of the stub (the engine client's receiver, taking in a step) holds the GIL then, the sender
waits until that thread is asked to let go: Python's switch interval, 5 ms by default. The Triton model sets a
shorter one (``triton_model.STUB_SWITCH_INTERVAL_S``); this bench says what each choice costs.
"""
from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import tempfile
from pathlib import Path

from trtllm_dflash.provenance import record

MODEL_NAME = "send_rate"
CONFIG = f"""name: "{MODEL_NAME}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "CASE" data_type: TYPE_STRING dims: [1] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [1] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
# The model: one case per request. The busy thread spins busy_us of pure Python, then sleeps to make the fraction.
MODEL = '''
import json, sys, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils


def tensor(text):
    return pb_utils.Tensor("OUT", np.array([text.encode()], dtype=object))


class TritonPythonModel:
    def execute(self, requests):
        for req in requests:
            case = json.loads(pb_utils.get_input_tensor_by_name(req, "CASE").as_numpy()[0])
            threading.Thread(target=self.run, args=(req.get_response_sender(), case), daemon=True).start()
        return None

    def run(self, sender, case):
        sys.setswitchinterval(case["interval_ms"] / 1e3)
        stop, spins = threading.Event(), [0]
        def busy():
            spin_s, frac = case["busy_us"] / 1e6, case["busy_fraction"]
            rest_s = spin_s * (1 - frac) / frac
            while not stop.is_set():
                end = time.perf_counter() + spin_s
                while time.perf_counter() < end:
                    spins[0] += 1
                if rest_s:
                    time.sleep(rest_s)
        if case["busy_fraction"] > 0:
            threading.Thread(target=busy, daemon=True).start()
        time.sleep(0.05)
        waits = []
        t0 = time.perf_counter()
        for _ in range(case["sends"]):
            t = time.perf_counter()
            sender.send(pb_utils.InferenceResponse(output_tensors=[tensor("x")]))
            waits.append(time.perf_counter() - t)
        took = time.perf_counter() - t0
        stop.set()
        waits.sort()
        stats = {"seconds": took, "sends_per_s": case["sends"] / took, "us_per_send": took / case["sends"] * 1e6,
                 "send_us_p50": waits[len(waits) // 2] * 1e6, "send_us_p99": waits[int(len(waits) * 0.99)] * 1e6,
                 "busy_spins": spins[0], "interval_ms_set": sys.getswitchinterval() * 1e3}
        sys.setswitchinterval(0.005)
        sender.send(pb_utils.InferenceResponse(output_tensors=[tensor(json.dumps(stats))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''


def run_case(client, case: dict) -> dict:
    import numpy as np
    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        inp = grpcclient.InferInput("CASE", [1], "BYTES")
        inp.set_data_from_numpy(np.array([json.dumps(case).encode()], dtype=object))
        client.async_stream_infer(MODEL_NAME, [inp])
        received = 0
        while True:
            result, error = got.get(timeout=300)
            if error is not None:
                raise RuntimeError(f"case {case}: {error}")
            received += 1
            text = result.as_numpy("OUT")[0]
            if text.startswith(b"{"):
                return {**case, **json.loads(text), "responses_received": received - 1}
    finally:
        client.stop_stream()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sends", type=int, default=2000, help="responses per case")
    p.add_argument("--intervals_ms", default="5,1,0.2,0.1", help="GIL switch intervals to try (5 = Python's default)")
    p.add_argument("--busy_fractions", default="0,0.1,1", help="time the other thread holds the GIL (0 = no thread)")
    p.add_argument("--busy_us", type=float, default=200.0, help="one stretch of the busy thread's work")
    p.add_argument("--out", required=True, help="results (JSON); a PNG beside it when matplotlib is there")
    args = p.parse_args(argv)

    import tritonclient.grpc as grpcclient
    from trtllm_dflash.serving import server, triton_model
    from trtllm_dflash.serving.launch import free_loopback_port
    from trtllm_dflash.serving.triton_env import find_tritonserver

    binary = find_tritonserver()
    intervals = [float(x) for x in args.intervals_ms.split(",")]
    stub_ms = triton_model.STUB_SWITCH_INTERVAL_S * 1e3
    cases = [{"interval_ms": ms, "busy_fraction": float(f), "busy_us": args.busy_us, "sends": args.sends}
             for f in args.busy_fractions.split(",") for ms in (intervals if float(f) > 0 else intervals[:1])]
    with tempfile.TemporaryDirectory(prefix="send_rate_") as tmp:
        repo = Path(tmp) / "repo"
        (repo / MODEL_NAME / "1").mkdir(parents=True)
        (repo / MODEL_NAME / "config.pbtxt").write_text(CONFIG)
        (repo / MODEL_NAME / "1" / "model.py").write_text(MODEL)
        http, grpc_port, metrics = free_loopback_port(), free_loopback_port(), free_loopback_port()
        cmd = server.build_cmd(binary, repo, "127.0.0.1", http, grpc_port, metrics, exit_timeout_secs=5)
        log = open(Path(tmp) / "tritonserver.log", "w")
        proc = server.start(cmd, server.server_env(binary), stdout=log)
        rows = []
        try:
            server.wait_ready(proc, f"127.0.0.1:{http}", timeout=120)
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            for i, case in enumerate(cases):
                row = run_case(client, case)
                rows.append(row)
                print(f"[{i + 1}/{len(cases)}] busy {row['busy_fraction']:.0%}, interval {row['interval_ms']:g} ms: "
                      f"{row['sends_per_s']:,.0f} sends/s (p50 {row['send_us_p50']:.0f} us, "
                      f"p99 {row['send_us_p99']:.0f} us)", flush=True)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.reap_group(proc.pid)
            log.close()
    out = Path(args.out)
    alone = next(r["sends_per_s"] for r in rows if r["busy_fraction"] == 0)
    summary = {"sends_per_s_alone": alone, "stub_switch_interval_ms": stub_ms,
               "by_busy_fraction": {str(f): {f"{r['interval_ms']:g}ms": round(r["sends_per_s"]) for r in rows
                                             if r["busy_fraction"] == f}
                                    for f in sorted({r["busy_fraction"] for r in rows if r["busy_fraction"] > 0})}}
    doc = {"summary": summary, "rows": rows, "tritonserver": {"path": binary.path, "source": binary.source},
           "cpus": _cpus(), "provenance": record(command=" ".join(["python -m trtllm_dflash.bench.triton_send_rate",
                                                                   *(argv if argv is not None else sys.argv[1:])]))}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    _plot(rows, out.with_suffix(".png"))
    print(json.dumps(summary, indent=1))
    return 0


def _cpus() -> int:
    import os
    return len(os.sched_getaffinity(0))


def _plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    alone = [r for r in rows if r["busy_fraction"] == 0]
    for frac in sorted({r["busy_fraction"] for r in rows if r["busy_fraction"] > 0}):
        part = [r for r in rows if r["busy_fraction"] == frac]
        ax.plot([r["interval_ms"] for r in part], [r["sends_per_s"] for r in part], "o-",
                label=f"another thread busy {frac:.0%} of the time")
    if alone:
        ax.axhline(alone[0]["sends_per_s"], color="gray", ls="--", label="no other thread")
    ax.set_xscale("log")
    ax.set_xlabel("stub's GIL switch interval (ms; Python's default 5)")
    ax.set_ylabel("responses sent / s")
    ax.set_title("Triton python backend, decoupled: one sender thread")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
