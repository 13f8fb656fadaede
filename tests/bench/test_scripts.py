# SPDX-License-Identifier: Apache-2.0
"""scripts/sweep_mpirun.sh (AR + DFlash sweep under mpirun, then the plot) and scripts/trtllm_bench.sh (the
TensorRT-LLM command lines for the same concurrency list)."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.conftest import REPO, check_row, read_rows
from trtllm_dflash.bench import results

MPIEXEC = Path(sys.executable).parent / "mpiexec"


@pytest.mark.mpi
def test_sweep_mpirun_script(tiny_engine_dir, tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "MPIRUN": str(MPIEXEC), "CONCURRENCY": "1,2",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = ["bash", str(REPO / "scripts" / "sweep_mpirun.sh"), str(tiny_engine_dir), str(tmp_path / "out"),
           "--num_requests", "2", "--max_new_tokens", "6", "--input_len", "8", "--ignore_eos"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = read_rows(tmp_path / "out" / "sweep.jsonl")
    assert [(r["label"], r["settings"]["concurrency"]) for r in rows] == [("AR", 1), ("AR", 2), ("DFlash", 1),
                                                                          ("DFlash", 2)]
    for row in rows:
        check_row(row, row["settings"]["concurrency"])
    assert (tmp_path / "out" / "pareto.png").is_file() and (tmp_path / "out" / "iso_interactivity.md").is_file()
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert again.returncode == 1 and "sweep.jsonl exists: move it away first" in again.stderr


def test_trtllm_bench_script_prints_the_same_levels(tiny_engine_dir, tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "CONCURRENCY": "1,4,16", "ISL": "128", "OSL": "64",
           "LABEL": "EAGLE-3", "MODEL": "Qwen/Qwen3-8B"}
    run = subprocess.run(["bash", str(REPO / "scripts" / "trtllm_bench.sh"), str(tiny_engine_dir), str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = [shlex.split(line) for line in run.stdout.splitlines() if line and not line.startswith("#")]
    bench = [c for c in lines if c[:1] == ["trtllm-bench"] and "throughput" in c]
    serving = [c for c in lines if "tensorrt_llm.serve.scripts.benchmark_serving" in c]
    (prepare,) = [c for c in lines if "prepare-dataset" in c]
    (serve,) = [c for c in lines if c[0] == "trtllm-serve"]

    def flag(cmd, name):
        return cmd[cmd.index(name) + 1]

    assert [flag(c, "--concurrency") for c in bench] == ["1", "4", "16"]
    assert [flag(c, "--max-concurrency") for c in serving] == ["1", "4", "16"]
    assert [flag(c, "--num_requests") for c in bench] == [flag(c, "--num-prompts") for c in serving] == ["8", "20", "80"]
    assert flag(prepare, "--num-requests") == "80" and flag(prepare, "--input-mean") == "128"
    for c in bench:
        assert flag(c, "--model") == "Qwen/Qwen3-8B" and flag(c, "--tp") == "1" and "--streaming" in c
        assert flag(c, "--extra_llm_api_options") == str(tiny_engine_dir.resolve() / "llm_api_options.yaml")
        assert flag(c, "--dataset") == flag(prepare, "--output")
    assert flag(serving[0], "--random-output-len") == "64" and "--ignore-eos" in serving[0]
    assert serve[1] == str(tiny_engine_dir.resolve() / "target")
    # the report names carry the concurrency that dflash-plot reads back
    reports = [Path(flag(c, "--report_json")) for c in bench]
    assert [results._concurrency(p, None) for p in reports] == [1, 4, 16]
    assert [results._concurrency(Path(flag(c, "--result-filename")), None) for c in serving] == [1, 4, 16]
    (plot_line,) = [c for c in lines if c[0] == "dflash-plot"]
    assert f"EAGLE-3 trtllm-bench={tmp_path}/EAGLE-3_bench_c*.json" in plot_line and "--num_gpus" in plot_line


def test_sweeps_md_commands_parse():
    from trtllm_dflash.bench import plot, sweep

    text = (REPO / "benchmarks" / "SWEEPS.md").read_text().replace("\\\n", " ")
    commands = [shlex.split(line, comments=True) for line in text.splitlines() if line.startswith("dflash-")]
    assert {c[0] for c in commands} == {"dflash-sweep", "dflash-plot"} and len(commands) >= 6
    for cmd in commands:
        (sweep if cmd[0] == "dflash-sweep" else plot).parse_args(cmd[1:])
    assert "sweep_mpirun.sh" in text and "trtllm_bench.sh" in text


@pytest.mark.mpi
def test_tp_sweep_smoke_runs_every_tp_size_through_mpiexec(tmp_path):
    """benchmarks/tp_sweep.sh SMOKE=1: a random Qwen3-shaped pair written to disk, dflash-build at TP 1 and 2, the
    sweep under mpiexec (gloo) for AR and DFlash, the summary's TP 2 / TP 1 ratios."""
    env = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"),
           "MPIRUN": str(MPIEXEC), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(["bash", str(REPO / "benchmarks" / "tp_sweep.sh")], env=env, capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = read_rows(tmp_path / "out" / "tp_sweep_smoke.jsonl")
    assert sorted({(r["label"], r["settings"]["tp_size"]) for r in rows}) == [
        ("AR TP 1", 1), ("AR TP 2", 2), ("DFlash TP 1", 1), ("DFlash TP 2", 2)]
    assert all(r["metrics"]["num_errors"] == 0 for r in rows)
    summary = json.loads((tmp_path / "out" / "tp_sweep_smoke.json").read_text())["summary"]
    assert set(summary["ratios"]) == {"tp2_over_tp1_ar_user_c1", "tp2_over_tp1_ar_gpu_c2",
                                      "tp2_over_tp1_dflash_user_c1", "tp2_over_tp1_dflash_gpu_c2"}
    assert (tmp_path / "out" / "tp_sweep_smoke.png").stat().st_size > 0
