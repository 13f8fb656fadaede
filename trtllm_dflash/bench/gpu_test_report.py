# SPDX-License-Identifier: Apache-2.0
"""Run GPU-marked tests and keep the evidence: pytest's summary, every test's outcome, and provenance.

    python -m trtllm_dflash.bench.gpu_test_report tests/runtime/test_mxfp4_moe.py --out gpu_tests.json

Exit status is pytest's, so a failing test fails the GPU stage too.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # the checkout: tests/ lives there, not in an installed package

from trtllm_dflash.provenance import record


def junit_details(xml: Path) -> dict[str, dict]:
    """node id -> {"seconds", "message" (failure/error text, first 3000 chars), "properties"} from pytest's junit XML
    (absent when pytest was stopped before writing it)."""
    import xml.etree.ElementTree as ET
    if not xml.exists():
        return {}
    found = {}
    for case in ET.parse(xml).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        entry = {"seconds": round(float(case.get("time", 0)), 2)}
        for tag in ("failure", "error"):
            bad = case.find(tag)
            if bad is not None:
                entry["message"] = ((bad.get("message") or "") + "\n" + (bad.text or ""))[:3000]
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if props:
            entry["properties"] = props
        found[f"{module}.py::{case.get('name')}"] = entry
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tests", nargs="+", help="test files or node ids")
    p.add_argument("--out", required=True, help="JSON report path")
    p.add_argument("--max_s", type=float, default=None,
                   help="stop pytest after this many seconds and report the tests that finished (exit 124)")
    args = p.parse_args(argv)
    # -v: one line per test as it finishes, so a run stopped at --max_s still says which tests passed
    # --show-capture=no: captured DEBUG logs (torch's tracer logs at that level) once buried the failure messages;
    # junit XML: every test's failure message and record_property values go into the report
    with tempfile.TemporaryDirectory() as tmp:   # the XML is read below, then removed with its folder
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-rA", "-v", "-p", "no:cacheprovider",
               "--show-capture=no", f"--junitxml={xml}", *args.tests]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.max_s)
            out, returncode, stopped = proc.stdout + proc.stderr, proc.returncode, ""
        except subprocess.TimeoutExpired as err:
            text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
            out, returncode = text(err.stdout) + text(err.stderr), 124
            stopped = f"stopped after {args.max_s:.0f} s (--max_s); "
        details = junit_details(xml)
    print(out[-6000:])
    outcome = {}
    for t, o in re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", out, re.M):
        outcome[t] = o
    for o, t in re.findall(r"^(PASSED|FAILED|ERROR)\s+(\S+::\S+)", out, re.M):   # -rA's summary lines
        outcome[t] = o
    per_test = [{"test": t, "outcome": o, **details.get(t, {})} for t, o in outcome.items()]
    summary = next((line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed|error|skipped)", line)), "")
    if stopped:
        counts = {o: sum(v == o for v in outcome.values()) for o in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
        summary = stopped + ", ".join(f"{n} {o.lower()}" for o, n in counts.items() if n) + " so far"
    report = {"provenance": record(["python", "-m", "trtllm_dflash.bench.gpu_test_report", *(argv if argv is not None else sys.argv[1:])]),
              "pytest_command": " ".join(["python", "-m", "pytest", *cmd[3:]]), "returncode": returncode,
              "summary": summary.strip("= "), "tests": per_test, "output_tail": out[-4000:]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)   # a fresh results folder on the GPU host, say
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return returncode


if __name__ == "__main__":
    sys.exit(main())
