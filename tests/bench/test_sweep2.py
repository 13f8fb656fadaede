# SPDX-License-Identifier: Apache-2.0
"""The sweep2 stage's pieces on CPU: dflash-sweep --mode adaptive records its policy and the blocks each level
ran, and trtllm_dflash/bench/sweep2_summary.py turns AR / DFlash / adaptive rows into the summary keys of issue #16."""
from __future__ import annotations

import json

from tests.bench.conftest import read_rows
from trtllm_dflash.bench import sweep

FAST = ["--num_requests", "4", "--max_new_tokens", "8", "--input_len", "8", "--ignore_eos", "--concurrency", "1,2"]


def test_adaptive_rows_and_summary(tiny_engine_dir, tmp_path):
    out = tmp_path / "sweep.jsonl"
    for mode in ("ar", "dflash", "adaptive"):
        assert sweep.main(["--engine", str(tiny_engine_dir), "--mode", mode, *FAST, "--out", str(out)]) == 0
    rows = read_rows(out)
    assert [r["label"] for r in rows] == ["AR"] * 2 + ["DFlash"] * 2 + ["DFlash adaptive"] * 2
    ad = rows[-1]["settings"]
    assert ad["draft_policy"] == "AdaptivePolicy" and rows[0]["settings"]["draft_policy"] == "FixedPolicy"
    assert sum(ad["block_counts"].values()) > 0 and all(int(b) <= 8 for b in ad["block_counts"])
    from trtllm_dflash.bench import sweep2_summary as mod
    summary_path = tmp_path / "summary.json"
    assert mod.main(["--sweep", str(out), "--engine", str(tiny_engine_dir), "--batch", "2", "--input_len", "8",
                     "--out", str(summary_path)]) == 0
    s = json.loads(summary_path.read_text())
    assert s["provenance"]["command"].startswith("python -m trtllm_dflash.bench.sweep2_summary")
    s = s["summary"]
    for key in ("min_adaptive_over_ar_iso_interactivity", "max_adaptive_over_ar_iso_interactivity",
                "min_fixed_over_ar_iso_interactivity"):
        assert key in s   # None when the fronts share no interactivity range (tiny CPU runs may not)
    assert s["steady_b2_adaptive"]["step_ms"] > 0 and s["itl_c2_over_steady_b2"] > 0
    # the fixed block beside it: the DFlash run's chunk gap over a steady batch at the deployment's block (every
    # step of it at that block: no policy in between)
    fixed = s["steady_b2_fixed"]
    assert fixed["step_ms"] > 0 and set(fixed["block_counts"]) == {str(rows[2]["settings"]["block_size"])}
    assert s["itl_c2_fixed_over_steady_b2_fixed"] == s["itl_c2_fixed_ms"] / fixed["step_ms"]
    assert s["levels"] == {"AR": [1, 2], "DFlash": [1, 2], "DFlash adaptive": [1, 2]}
