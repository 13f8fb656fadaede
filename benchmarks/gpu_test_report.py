# SPDX-License-Identifier: Apache-2.0
"""Run GPU-marked tests and keep the evidence: pytest's summary, every test's outcome, and provenance.

    python benchmarks/gpu_test_report.py tests/runtime/test_mxfp4_moe.py --out gpu_tests.json

Exit status is pytest's, so a failing test fails the GPU stage too.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtllm_dflash.provenance import record  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tests", nargs="+", help="test files or node ids")
    p.add_argument("--out", required=True, help="JSON report path")
    args = p.parse_args(argv)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-rA", "-q", "-p", "no:cacheprovider", *args.tests]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    print(out[-6000:])
    per_test = [{"test": t, "outcome": o} for o, t in re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED)\s+(\S+)", out, re.M)]
    summary = next((line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed|error)", line)), "")
    report = {"provenance": record(["gpu_test_report.py", *(argv if argv is not None else sys.argv[1:])]),
              "pytest_command": " ".join(["python", "-m", "pytest", *cmd[3:]]), "returncode": proc.returncode,
              "summary": summary.strip("= "), "tests": per_test, "output_tail": out[-4000:]}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
