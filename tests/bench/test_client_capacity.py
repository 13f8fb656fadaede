# SPDX-License-Identifier: Apache-2.0
"""bench/client_capacity.py: the sweep's OpenAI client, in one and in two processes, against a stand-in server
whose pace is known."""
from __future__ import annotations

import json

from tests.bench.conftest import in_a_process_of_its_own


def test_rows_for_every_level_and_process_count_and_the_pace_is_never_beaten(tmp_path):
    """Run as a command: its spawned processes start multiprocessing's resource tracker, a child that lives as long
    as its parent (not this test process, whose children other tests count)."""
    out = tmp_path / "cap.json"
    run = in_a_process_of_its_own(["-m", "trtllm_dflash.bench.client_capacity", "--concurrency", "2,4",
                                   "--client_processes", "1,2", "--step_ms", "5", "--tokens", "12", "--requests", "2",
                                   "--out", str(out)])
    assert run.returncode == 0, run.stderr[-3000:]
    d = json.loads(out.read_text())
    assert [(r["concurrency"], r["client_processes"]) for r in d["rows"]] == [(2, 1), (2, 2), (4, 1), (4, 2)]
    for r in d["rows"]:
        assert r["errors"] == 0 and r["tok_s_paced"] == r["concurrency"] * 200
        # one chunk per stream per step: a client can read no faster than that, however many processes read
        assert r["tpot_ms_p50"] >= 4.0 and 0 < r["read_over_paced"] <= 1.05
    assert d["provenance"]["command"].startswith("python -m trtllm_dflash.bench.client_capacity")
