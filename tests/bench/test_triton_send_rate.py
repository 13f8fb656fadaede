# SPDX-License-Identifier: Apache-2.0
"""bench/triton_send_rate.py against a real tritonserver: every case's responses arrive, the stub ran under the
switch interval the case asked for, the busy thread ran beside the sender, and no server is left running."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.bench.conftest import REPO

pytest.importorskip("tritonclient.grpc")
pytest.importorskip("pytriton")


@pytest.mark.slow
def test_send_rate_cases(tmp_path):
    out = tmp_path / "send_rate.json"
    run = subprocess.run([sys.executable, "-m", "trtllm_dflash.bench.triton_send_rate", "--sends", "40",
                          "--intervals_ms", "5,0.1", "--busy_fractions", "0,0.5", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-4000:]
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [(r["busy_fraction"], r["interval_ms"]) for r in rows] == [(0.0, 5.0), (0.5, 5.0), (0.5, 0.1)]
    for r in rows:
        assert r["responses_received"] == 40 and r["sends_per_s"] > 0
        assert r["interval_ms_set"] == pytest.approx(r["interval_ms"])
        assert (r["busy_spins"] > 0) == (r["busy_fraction"] > 0)
    assert doc["summary"]["sends_per_s_alone"] == rows[0]["sends_per_s"]
    assert set(doc["summary"]["by_busy_fraction"]["0.5"]) == {"5ms", "0.1ms"}
    assert "provenance" in doc
    ps = subprocess.run(["pgrep", "-f", "send_rate_"], capture_output=True, text=True)
    assert not ps.stdout.strip(), "a tritonserver of the bench is still running"
