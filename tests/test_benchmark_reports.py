# SPDX-License-Identifier: Apache-2.0
"""Benchmark scripts write their provenance (CPU smoke modes), and the GPU test report reads pytest's junit XML."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script(name):
    return importlib.import_module(f"trtllm_dflash.bench.{name}")


def test_fp8_gemm_bench_smoke_records_provenance(tmp_path):
    out = tmp_path / "fp8.json"
    proc = subprocess.run([sys.executable, "-m", "trtllm_dflash.bench.fp8_gemm", "--cpu_smoke", "--skip", "steps",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    prov = json.loads(out.read_text())["provenance"]
    assert "-m trtllm_dflash.bench.fp8_gemm --cpu_smoke" in prov["command"]
    assert prov["git"]["sha"] and prov["versions"]["torch"] and prov["device"]["gpu"] is None


def test_gpu_report_reads_every_outcome_and_property(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text("""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.gpu.test_a" name="test_ok" time="1.25"><properties>
<property name="divergences" value="[{'prompt': 3}]"/></properties></testcase>
<testcase classname="tests.gpu.test_a" name="test_bad" time="0.5"><failure message="assert 1 == 2">trace</failure></testcase>
<testcase classname="tests.gpu.test_b" name="test_tp" time="0"><skipped message="NCCL TP 2 needs 2 GPUs"/></testcase>
</testsuite></testsuites>""")
    tests = _script("gpu_tests").parse_junit(xml)
    assert [(t["id"], t["outcome"], t["seconds"]) for t in tests] == [
        ("tests.gpu.test_a::test_ok", "passed", 1.25), ("tests.gpu.test_a::test_bad", "failed", 0.5),
        ("tests.gpu.test_b::test_tp", "skipped", 0.0)]
    assert tests[0]["properties"] == {"divergences": "[{'prompt': 3}]"} and tests[1]["message"] == "assert 1 == 2"


def test_gpu_report_collects_every_module_with_gpu_tests():
    files = _script("gpu_tests").gpu_test_files()
    assert {"tests/gpu/test_cuda_runtime.py", "tests/gpu/test_smollm2_cuda.py"} <= set(files)
    assert "tests/test_benchmark_reports.py" not in files and "tests/test_conftest_gpu_hook.py" not in files


def test_cuda_check_smoke_records_every_row_and_its_checkpoints(tmp_path):
    out = tmp_path / "cuda_check.json"
    proc = subprocess.run([sys.executable, "-m", "trtllm_dflash.bench.cuda_check", "--cpu_smoke", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert [(r["arch"], r["dtype"]) for r in res["tiny"]] == [("llama", "float32"), ("qwen3", "float32")]
    assert all(r["dflash_eq_ar_greedy"] == r["ar_eq_hf_greedy"] == r["dflash_eq_ar_sampled"] == 6 for r in res["tiny"])
    prov = res["provenance"]
    assert prov["command"].startswith("python -m trtllm_dflash.bench.cuda_check --cpu_smoke") and prov["git"]["sha"]
    assert {"tiny_llama_target", "tiny_llama_drafter", "tiny_qwen3_target", "tiny_qwen3_drafter"} == set(prov["checkpoints"])
    assert all(len(c["sha256"]) == 64 for c in prov["checkpoints"].values())


def test_layer_op_counts_of_this_tree():
    # the per-layer counts that benchmarks/results/layer_op_counts.json reports, recomputed on this tree: the
    # drafter's block layer runs exactly the target's layer (one Attention, one DecoderLayer), a decode step
    # writes the cache without an arange per layer, and the Llama layer stays at 11 launches on CUDA
    counts = _script("layer_op_counts").count_one(str(ROOT))
    target, draft = counts["qwen3.target_verify"], counts["dflash_drafter.drafter_block"]
    assert draft["per_layer_ops"] == target["per_layer_ops"] and "arange (op)" not in target["per_layer_ops"]
    assert target["per_layer"]["cuda_kernels_estimate"] == counts["llama.target_verify"]["per_layer"][
        "cuda_kernels_estimate"] == 11
    assert counts["dflash_drafter.drafter_context"]["per_layer_ops"]["index_put_ (op)"] == 2
