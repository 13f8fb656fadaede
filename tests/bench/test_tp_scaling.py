# SPDX-License-Identifier: Apache-2.0
"""trtllm_dflash/bench/tp_scaling.py: TP N steps over the TP 1 step of the same machine, the all-reduce median."""
from __future__ import annotations

import json

from trtllm_dflash.bench import tp_scaling


def _run(tp, steps, allreduce=(), strategy="auto"):
    return {"tp_size": tp, "gpu": "NVIDIA H200", "tiny_tp_equals_tp1": True, "allreduce": {"strategy": strategy},
            "rows": [{"model": "qwen3-8b", "tp_size": tp, "mode": m, "batch": b, "step_ms": ms}
                     for (m, b), ms in steps.items()], "allreduce_rows": list(allreduce)}


def test_ratios_to_tp1_and_the_decode_size_all_reduce():
    tp1 = _run(1, {("ar", 1): 5.0, ("dflash", 1): 6.0, ("ar", 64): 6.5}, strategy="nccl")
    tp2 = _run(2, {("ar", 1): 4.0, ("dflash", 1): 4.5, ("ar", 64): 5.2},
               [{"bytes": 2048, "nccl_us": 15.0, "oneshot_us": 6.0}, {"bytes": 65536, "nccl_us": 16.0, "oneshot_us": 7.0},
                {"bytes": 32768, "nccl_us": 15.5, "oneshot_us": 6.5}, {"bytes": 1 << 20, "nccl_us": 23.0}])
    s = tp_scaling.summarize([tp1, tp2])
    assert s["qwen3_tp2_over_tp1_ar_b1"] == 0.8 and s["qwen3_tp2_over_tp1_dflash_b1"] == 0.75
    assert s["ratios"]["qwen3-8b_tp2_over_tp1_ar_b64"] == 0.8
    assert s["qwen3_tp4_over_tp1_ar_b1"] is None and s["gptoss120b_tp2_over_tp1_ar_b1"] is None  # not measured
    assert s["allreduce_us_p50"] == 6.5          # one-shot, <= 64 KB only
    assert s["gpu"] == "NVIDIA H200" and s["tp_sizes"] == [1, 2] and s["allreduce_strategy"] == ["auto"]


def test_main_needs_a_tp1_run(tmp_path, capsys):
    two = tmp_path / "tp2.json"
    two.write_text(json.dumps(_run(2, {("ar", 1): 4.0})))
    assert tp_scaling.main([str(two), "--out", str(tmp_path / "o.json")]) == 2
    assert "none of them is TP 1" in capsys.readouterr().err
    one = tmp_path / "tp1.json"
    one.write_text(json.dumps(_run(1, {("ar", 1): 5.0})))
    assert tp_scaling.main([str(one), str(two), "--out", str(tmp_path / "o.json")]) == 0
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["summary"]["qwen3_tp2_over_tp1_ar_b1"] == 0.8 and out["run_files"] == [str(one), str(two)]
