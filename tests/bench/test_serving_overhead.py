# SPDX-License-Identifier: Apache-2.0
"""bench/serving_overhead.py --server triton: a real dflash-serve over the GIL-holding engine stand-in, gRPC
clients in two processes; the report has its fields, the clients got tokens, nothing is left running."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.bench.conftest import REPO

pytest.importorskip("tritonclient.grpc")
pytest.importorskip("pytriton")


@pytest.mark.slow
def test_triton_server_overhead_report(tmp_path):
    out = tmp_path / "triton.json"
    run = subprocess.run([sys.executable, "-m", "trtllm_dflash.bench.serving_overhead", "--server", "triton",
                          "--streams", "4", "--client_procs", "2", "--seconds", "1.5", "--busy_ms", "1",
                          "--wait_ms", "1", "--tokenizer", "chars", "--triton_model", "under test", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(out.read_text())
    for key in ("steps_per_s_alone", "steps_per_s_served", "engine_tok_s_alone", "responses_per_s", "tok_s_received",
                "sent_over_alone", "tokens_per_response", "frontend_cpu_us_per_token", "triton_cpu_us_per_token",
                "guard_cpu_us_per_token", "engine_cpu_ms_per_step_served", "client_cpu_util", "triton_model_git_blob",
                "other_cpu_util_alone", "other_cpu_util_served",
                "provenance"):
        assert key in report, key
    assert report["server"] == "triton" and report["triton_model"] == "under test"
    assert report["responses_per_s"] > 0 and report["tok_s_received"] > 0 and report["tokens_per_response"] >= 1
    assert report["cpu_s_served"]["tritonserver_and_stub"] > 0 and report["cpu_s_served"]["engine"] > 0
    assert len(report["clients"]) == 2 and all(c["started"] == 2 and not c["errors"] for c in report["clients"])
    assert report["dflash_serve_exit_code"] == 0
