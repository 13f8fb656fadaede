# SPDX-License-Identifier: Apache-2.0
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from trtllm_dflash.bench import drafter_scaling
from trtllm_dflash.errors import DFlashError

ROOT = Path(__file__).resolve().parents[2]
V9 = ROOT / "benchmarks/results/train_smollm2_v9_h200x4/summary.json"


def _section(slope=0.3, intercept=-5.0, mt_offset=0.2):
    tokens = {"v2": 20e6, "v3": 80e6, "v5": 160e6, "v6": 230e6}
    tau = {v: intercept + slope * math.log2(n) for v, n in tokens.items()}
    return {"tokens_trained_in_all": tokens,
            "tau_greedy_b16": {"humaneval": tau, "mtbench": {v: t + mt_offset for v, t in tau.items()}}}


def test_fit_recovers_a_line_and_the_goal_multiple():
    out = drafter_scaling.scaling(_section(), {"humaneval": 3.5})
    he = out["datasets"]["humaneval"]
    assert he["fit"]["slope"] == pytest.approx(0.3, abs=1e-4)
    assert all(v == pytest.approx(0.3, abs=1e-3) for v in he["tau_per_doubling_steps"].values())
    assert list(he["tau_per_doubling_steps"]) == ["v2_to_v3", "v3_to_v5", "v5_to_v6"]
    last = he["tau"]["v6"]
    assert he["goal"]["tokens_multiple_of_last"] == pytest.approx(2 ** ((3.5 - last) / 0.3), rel=1e-3)
    # at that many tokens the line reaches the goal
    assert -5.0 + 0.3 * math.log2(he["goal"]["tokens_needed"]) == pytest.approx(3.5, abs=1e-3)
    assert "goal" not in out["datasets"]["mtbench"]


def test_fit_refuses_one_point_and_equal_tokens():
    with pytest.raises(DFlashError, match="two or more"):
        drafter_scaling.fit({"v2": 1e6}, {"v2": 2.0})
    with pytest.raises(DFlashError, match="same token count"):
        drafter_scaling.fit({"v2": 1e6, "v3": 1e6}, {"v2": 2.0, "v3": 2.1})


def test_committed_summary_agrees_with_the_tool():
    """The v9 run's summary states the fit and the goal's multiple; the tool computes them from its points."""
    summary = json.loads(V9.read_text())
    out = drafter_scaling.scaling(summary["scaling"], {"humaneval": 3.5})
    for ds, slope in summary["scaling"]["tau_per_doubling_fit_v2_to_v9"].items():
        assert round(out["datasets"][ds]["fit"]["slope"], 3) == pytest.approx(slope, abs=1e-3)
    assert out["datasets"]["humaneval"]["goal"]["tokens_multiple_of_last"] == pytest.approx(
        summary["scaling"]["humaneval_3_5_needs_tokens_x_v9"], abs=0.05)


def test_cli_writes_json_and_png(tmp_path):
    src = tmp_path / "summary.json"
    src.write_text(json.dumps({"scaling": _section()}))
    r = subprocess.run([sys.executable, "-m", "trtllm_dflash.bench.drafter_scaling", str(src), "--goal",
                        "humaneval=3.5", "--out", str(tmp_path / "sc")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "HumanEval: slope 0.300" in r.stdout
    assert json.loads((tmp_path / "sc.json").read_text())["datasets"]["humaneval"]["goal"]["tau"] == 3.5
    assert (tmp_path / "sc.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("content, args, field", [
    ({"other": 1}, [], "summary: "),
    ({"scaling": _section()}, ["--goal", "humaneval"], "--goal: "),
])
def test_cli_bad_input_is_one_line(tmp_path, content, args, field):
    src = tmp_path / "summary.json"
    src.write_text(json.dumps(content))
    r = subprocess.run([sys.executable, "-m", "trtllm_dflash.bench.drafter_scaling", str(src), *args,
                        "--out", str(tmp_path / "sc")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and field in r.stderr and "Fix:" in r.stderr
    assert not (tmp_path / "sc.json").exists()
