# SPDX-License-Identifier: Apache-2.0
"""benchmarks/soak.py: its checks fed with results that must fail them, its metrics parsing and arguments."""
from __future__ import annotations

import importlib.util
import sys
from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("soak", REPO / "benchmarks" / "soak.py")
soak = sys.modules["soak"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(soak)


def _outcome(prompt=0, text="a", status="ok", reason="length", phase="load"):
    return soak.Outcome(phase, "http", prompt, 0.0, status=status, latency_s=1.0, finish_reason=reason, text=text)


def _args(**kw):
    return Namespace(**{"max_rss_growth": 0.10, **kw})


def _evaluate(outcomes, delta, rss=None, faults=()):
    rss = rss or {"growth": 0.01}
    return soak.evaluate(_args(), ["a", "b"], outcomes, list(faults), None, {"after_load": 0.1}, delta, rss, True, None)


def test_checks_fail_on_wrong_answers_errors_and_metric_disagreement():
    good = _evaluate([_outcome(0, "a"), _outcome(1, "b", reason="stop")], {"length": 1, "stop": 1})
    assert all(c["pass"] for c in good.values()), good
    wrong = _evaluate([_outcome(0, "b")], {"length": 1})
    assert not wrong["greedy_equals_solo"]["pass"] and wrong["greedy_equals_solo"]["wrong"] == 1
    failed = _evaluate([_outcome(status="dropped", reason=None)], {})
    assert not failed["every_request_answered"]["pass"]
    assert not _evaluate([_outcome()], {"length": 2})["metrics_agree"]["pass"]     # server counted one more
    assert not _evaluate([_outcome()], {"length": 1, "error": 1})["metrics_agree"]["pass"]
    # a killed client that had not streamed may or may not have reached the model
    kill = {"fault": "kill", "pass": True, "finished": {}, "uncertain_cancelled": 1}
    assert _evaluate([_outcome()], {"length": 1, "cancelled": 1}, faults=[kill])["metrics_agree"]["pass"]
    assert _evaluate([_outcome()], {"length": 1}, faults=[kill])["metrics_agree"]["pass"]
    assert not _evaluate([_outcome()], {"length": 1, "cancelled": 2}, faults=[kill])["metrics_agree"]["pass"]
    assert not _evaluate([_outcome()], {"length": 1}, rss={"growth": 0.2})["rss_bounded"]["pass"]


def test_rss_growth_and_metrics_parsing():
    samples = [{"t": t, "rss_mb": 100.0 + t} for t in range(0, 21)]
    g = soak.rss_growth(samples, t_from=0, t_to=20, warmup=5)
    assert g["baseline_mb"] == 106.0 and g["end_mb"] == 119.0 and g["growth"] == pytest.approx(13 / 106, abs=1e-4)
    text = ('# HELP dflash_requests_total x\ndflash_requests_total{finish_reason="length",model="m",version="1"} 7\n'
            'dflash_requests_total{model="m",finish_reason="cancelled",version="1"} 2\n'
            'dflash_active_requests{model="m",version="1"} 0\nnv_inference_count{model="m"} 3.000000e+00\n')
    m = soak.parse_metrics(text)
    assert soak.finish_counts(m) == {"length": 7.0, "cancelled": 2.0}
    assert soak.metric_sum(m, "dflash_active_requests") == 0.0 and soak.metric_sum(m, "nv_inference_count") == 3.0


def test_help_and_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        soak.parse_args(["--help"])
    assert "kill" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        soak.parse_args(["--engine", str(tmp_path), "--out", str(tmp_path / "x.json")])
    assert "has no manifest.json" in capsys.readouterr().err
