# SPDX-License-Identifier: Apache-2.0
"""The GPU test set's report: `pytest -m gpu` (every module with gpu-marked tests) plus cuda_check.py, in one JSON with the
outcome and duration of every test, what the tests attached (divergence positions, margins, tau), every
cuda_check row, and the provenance of the run.

    python -m trtllm_dflash.bench.gpu_tests --out benchmarks/results/gpu_tests_h100.json     # on the GPU host
    python -m trtllm_dflash.bench.gpu_tests --cpu_smoke --out /tmp/gpu_tests.json            # CPU: gpu tests skip, cuda_check smoke

Exit status 1 when a test failed or cuda_check's policy was not met (the report is written either way).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # the checkout: tests/ lives there, not in an installed package

from trtllm_dflash.provenance import record


GPU_MARK = re.compile(r"^\s*(@pytest\.mark\.gpu\b|pytestmark = .*pytest\.mark\.gpu\b)", re.M)


def gpu_test_files() -> list[str]:
    """Every test module with gpu-marked tests (tests/gpu and the mirrored modules elsewhere): collecting only
    these keeps modules that need packages the GPU host lacks (Triton server, ModelOpt) out of the run."""
    return sorted(str(f.relative_to(ROOT)) for f in (ROOT / "tests").rglob("test_*.py") if GPU_MARK.search(f.read_text()))


def parse_junit(path: Path) -> list[dict]:
    """One entry per test case: id, outcome (passed / failed / error / skipped), seconds, message, properties."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", None
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (el.get("message") or el.text or "")[:2000]
                break
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        tests.append({"id": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": round(float(case.get("time") or 0), 2), "message": message,
                      "properties": props})
    return tests


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the report (JSON)")
    p.add_argument("--cuda_check_out", default=None, help="also keep cuda_check's own JSON here")
    p.add_argument("--cpu_smoke", action="store_true", help="CPU: the gpu tests are collected and skipped, "
                                                            "cuda_check runs its --cpu_smoke")
    p.add_argument("--skip_cuda_check", action="store_true",
                   help="pytest only (gpu_smollm2.sh runs cuda_check as its own stage, to stay within one call's 10 min)")
    p.add_argument("--pytest_args", default="", help="extra pytest arguments, e.g. '-k fp8' (space-separated)")
    args = p.parse_args(argv)
    report = {"suite": "pytest -m gpu " + " ".join(gpu_test_files()), "tests": [], "cuda_check": None}
    rc = 0
    with tempfile.TemporaryDirectory() as d:
        junit = Path(d) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", *gpu_test_files(), "-p", "no:cacheprovider", "-q", "-rs",
               "-o", "junit_logging=no", f"--junitxml={junit}", *args.pytest_args.split()]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT)
        report["pytest_seconds"] = round(time.perf_counter() - t0, 1)
        report["pytest_exit"] = proc.returncode
        report["tests"] = parse_junit(junit) if junit.is_file() else []
        rc |= proc.returncode not in (0, 5)   # 5: nothing collected
        if not args.skip_cuda_check:
            cc_out = Path(args.cuda_check_out) if args.cuda_check_out else Path(d) / "cuda_check.json"
            cc = [sys.executable, "-m", "trtllm_dflash.bench.cuda_check", "--smollm2", "--out", str(cc_out)]
            t0 = time.perf_counter()
            proc = subprocess.run(cc + (["--cpu_smoke"] if args.cpu_smoke else []), cwd=ROOT)
            report["cuda_check_seconds"] = round(time.perf_counter() - t0, 1)
            report["cuda_check_exit"] = proc.returncode
            report["cuda_check"] = json.loads(cc_out.read_text()) if cc_out.is_file() else None
            rc |= proc.returncode != 0
    counts = {}
    for t in report["tests"]:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    report["summary"] = {**counts, **({} if args.skip_cuda_check else
                                       {"cuda_check_policy_met": report["cuda_check_exit"] == 0})}
    smollm2 = (report["cuda_check"] or {}).get("smollm2") or []
    checkpoints = {k: v["path"] for k, v in ((report["cuda_check"] or {}).get("provenance") or {})
                   .get("checkpoints", {}).items() if Path(v["path"]).exists()}
    if not checkpoints and any("smollm2" in f for f in gpu_test_files()):   # what the SmolLM2 tests read
        from trtllm_dflash.checkpoints.packaged import SMOLLM2_DIR_NAME, cache_root
        from trtllm_dflash.checkpoints.resolve import shipped_drafter_dir
        target = cache_root() / SMOLLM2_DIR_NAME
        if (target / "config.json").is_file():
            checkpoints = {"smollm2_target": target, "smollm2_drafter": shipped_drafter_dir("smollm2-135m-dflash")}
    report["provenance"] = record(["python", "-m", "trtllm_dflash.bench.gpu_tests", *(sys.argv[1:] if argv is None else argv)],
                                  checkpoints=checkpoints)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["summary"]), f"({len(smollm2)} SmolLM2 rows)", f"wrote {args.out}")
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
