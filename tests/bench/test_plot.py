# SPDX-License-Identifier: Apache-2.0
"""dflash-plot: Pareto fronts, log-log interpolation, the iso-interactivity ratio table, the PNGs, and the
trtllm-bench / benchmark_serving reports it reads besides dflash-sweep JSONL."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from trtllm_dflash.bench import plot, results
from trtllm_dflash.errors import DFlashError


def sweep_row(label, c, user, gpu, al=None):
    return {"schema": "trtllm_dflash.sweep/1", "label": label, "settings": {"concurrency": c},
            "metrics": {"tok_s_user": user, "tok_s_user_e2e": user * 0.9, "tok_s_gpu": gpu,
                        "acceptance_length_mean": al}}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# Model curves: AR serves C users at 100/C^0.2 tok/s each. "Fast" is exactly 3x AR's throughput at every
# interactivity: in log-log space a shifted straight line, so interpolation must give 3.00 everywhere.
CONC = [1, 2, 4, 8, 16, 32, 64]


def ar_point(c):
    return 100 * c ** -0.2, 100 * c ** 0.8


def test_pareto_front_drops_dominated_points():
    curve = [(10, 5, 1), (8, 9, 2), (9, 4, 3), (3, 20, 4), (2, 15, 5)]
    assert plot.pareto_front(curve) == [(3, 20, 4), (8, 9, 2), (10, 5, 1)]


def test_iso_ratio_is_exact_for_parallel_loglog_lines():
    ar = [(*ar_point(c), c) for c in CONC]
    fast = [(x * 1.5, y * 3 * 1.5 ** -4, c) for x, y, c in ar]   # y = 3 * AR's y at the same x (slope -4)
    rows = plot.iso_ratio(ar, fast)
    assert rows and all(r["ratio"] == pytest.approx(3.0) for r in rows)
    xs = [r["tok_s_user"] for r in rows]
    assert min(xs) >= fast[-1][0] - 1e-9 and max(xs) <= ar[0][0] + 1e-9     # only where both curves exist
    assert plot.iso_ratio(ar, [(1e4, 1.0, 1), (2e4, 0.5, 2)]) == []           # no overlap, no extrapolation


def test_interp_loglog_hits_the_points_and_is_geometric_between():
    front = [(1.0, 100.0, 4), (100.0, 1.0, 1)]
    assert plot.interp_loglog(front, np.array([1.0, 10.0, 100.0])) == pytest.approx([100.0, 10.0, 1.0])


def test_plot_main_writes_pngs_and_the_table(tmp_path, capsys):
    ar = write_jsonl(tmp_path / "ar.jsonl", [sweep_row("AR", c, *ar_point(c), 1.0) for c in CONC])
    # DFlash: twice the interactivity at every concurrency and, at equal interactivity, 2x the throughput
    df = write_jsonl(tmp_path / "df.jsonl", [sweep_row("DFlash", c, ar_point(c)[0] * 2, ar_point(c)[1] * 2 / 16, 3.1)
                                             for c in CONC])
    out = tmp_path / "plots"
    assert plot.main([str(ar), str(df), "--out_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("pareto.png", "iso_interactivity.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    table = (out / "iso_interactivity.md").read_text()
    assert "### DFlash vs AR: throughput at equal interactivity" in table and table.strip() in printed
    assert "| tok_s_user | AR tok/s/gpu | DFlash tok/s/gpu | ratio |" in table
    assert "max 2.00x" in table and "| DFlash | 64 |" in table and "| 3.10 |" in table
    # LABEL=PATH renames a run; --baseline picks the divisor
    assert plot.main([f"base={ar}", f"new={df}", "--out_dir", str(out), "--baseline", "new", "--log"]) == 0
    assert "### base vs new" in (out / "iso_interactivity.md").read_text()
    with pytest.raises(DFlashError, match="--baseline: 'nope' is not a run label"):
        plot.main([str(ar), "--out_dir", str(out), "--baseline", "nope"])


def test_reads_trtllm_bench_and_benchmark_serving_reports(tmp_path):
    report = {"performance": {"output_throughput_per_gpu_tok_s": 950.0, "output_throughput_per_user_tok_s": 40.0},
              "streaming_metrics": {"token_output_speed_tok_s": 55.0},
              "decoding_stats": {"mode": "Eagle3", "acceptance_length_percentiles": {"average": 2.9}},
              "world_info": {"tp_size": 8}, "request_info": {"avg_num_concurrent_requests": 15.7}}
    (tmp_path / "eagle3_c16.json").write_text(json.dumps(report))
    (tmp_path / "eagle3_c4.json").write_text(json.dumps(report))
    pts = results.load(f"EAGLE-3={tmp_path}/eagle3_c*.json")
    assert [(p.label, p.concurrency, p.tok_s_user, p.tok_s_gpu, p.acceptance_length) for p in pts] == [
        ("EAGLE-3", 16, 55.0, 950.0, 2.9), ("EAGLE-3", 4, 55.0, 950.0, 2.9)]
    assert results.load(str(tmp_path / "eagle3_c4.json"))[0].label == "TRT-LLM Eagle3"
    serving = {"max_concurrency": 8, "output_throughput": 4000.0, "mean_tpot_ms": 20.0, "user_throughput": 45.0,
               "avg_decoded_tokens_per_iter": {"mean": 2.5}}
    (tmp_path / "bs.json").write_text(json.dumps(serving))
    (p,) = results.load(str(tmp_path / "bs.json"), num_gpus=4)
    assert (p.concurrency, p.tok_s_user, p.tok_s_user_e2e, p.tok_s_gpu, p.acceptance_length) == (8, 50.0, 45.0, 1000.0, 2.5)
    with pytest.raises(DFlashError, match="--num_gpus"):
        results.load(str(tmp_path / "bs.json"))
    (tmp_path / "report.json").write_text(json.dumps(report))
    with pytest.raises(DFlashError, match="does not say its concurrency"):
        results.load(str(tmp_path / "report.json"))
    with pytest.raises(DFlashError, match="matches no file"):
        results.load(str(tmp_path / "missing.jsonl"))


def test_cli_error_is_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "a sweep"}\n')
    run = subprocess.run([sys.executable, "-m", "trtllm_dflash.bench.plot", str(bad)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2 and run.stderr.startswith("error: results:") and run.stderr.count("\n") == 1


def test_iso_picture_says_when_the_curves_do_not_overlap():
    """Empty axes looked like a broken plot; the picture now says which run shares no interactivity range."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trtllm_dflash.bench import plot

    fig = plot.iso_figure(plt, {"dflash": [], "other": [{"tok_s_user": 10.0, "ratio": 1.2}]}, "ar", "tok/s/user")
    texts = [t.get_text() for t in fig.axes[0].texts]
    plt.close(fig)
    assert len(texts) == 1 and "dflash: no overlap with ar in tok/s/user" in texts[0] and "other" not in texts[0]
