# SPDX-License-Identifier: Apache-2.0
"""bench/tp_sweep_summary.py: rows of one deployment at several TP sizes -> TP N / TP 1 per mode."""
from __future__ import annotations

import json

from trtllm_dflash.bench import tp_sweep_summary
from trtllm_dflash.errors import exit_code


def _row(mode, tp, c, user, gpu):
    return {"label": f"{mode} TP {tp}", "settings": {"mode": mode, "tp_size": tp, "concurrency": c, "gpu_name": "X"},
            "metrics": {"tok_s_user": user, "tok_s_gpu": gpu}}


def test_ratios_are_latency_at_the_lowest_and_cost_at_the_highest_concurrency():
    rows = [_row("ar", 1, 1, 100.0, 100.0), _row("ar", 1, 64, 50.0, 3000.0),
            _row("ar", 2, 1, 150.0, 75.0), _row("ar", 2, 64, 80.0, 2400.0),
            _row("dflash", 2, 1, 90.0, 45.0)]          # no DFlash TP 1: no DFlash ratio
    s = tp_sweep_summary.summarize(rows)
    assert s["ratios"] == {"tp2_over_tp1_ar_user_c1": 1.5, "tp2_over_tp1_ar_gpu_c64": 0.8}
    assert s["tp_sizes"] == [1, 2] and s["concurrency"] == [1, 64] and s["gpu"] == "X"
    assert s["by_mode"]["ar"]["tp2"]["c64"] == {"tok_s_user": 80.0, "tok_s_gpu": 2400.0}


def test_a_sweep_without_tp1_is_refused(tmp_path, capsys):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(_row("ar", 2, 1, 1.0, 1.0)) + "\n")
    assert exit_code(tp_sweep_summary.main, [str(path), "--out", str(tmp_path / "o.json")]) == 2
    assert "no TP 1 rows" in capsys.readouterr().err and not (tmp_path / "o.json").exists()
