# SPDX-License-Identifier: Apache-2.0
"""gpu_test_report: runs the gpu-marked tests it is given and keeps each one's outcome, pytest's exit status and
the failure text, in a report written to a folder it makes if need be."""
from __future__ import annotations

import json

from trtllm_dflash.bench.gpu_test_report import main

CASES = '''
import pytest

@pytest.mark.gpu
def test_kept():
    assert 1 + 1 == 2

@pytest.mark.gpu
def test_broken():
    assert 1 + 1 == 3, "arithmetic moved"

def test_not_gpu():
    raise AssertionError("not selected: no gpu mark")
'''


def test_outcomes_exit_status_and_failure_text_land_in_a_new_folder(tmp_path):
    cases = tmp_path / "test_cases.py"
    cases.write_text(CASES)
    out = tmp_path / "new" / "folder" / "report.json"
    assert main([str(cases), "--out", str(out)]) == 1          # pytest's: a GPU test failed
    report = json.loads(out.read_text())
    outcomes = {t["test"].rsplit("::", 1)[1]: t for t in report["tests"]}
    assert {k: t["outcome"] for k, t in outcomes.items()} == {"test_kept": "PASSED", "test_broken": "FAILED"}
    assert "arithmetic moved" in report["output_tail"]   # (per-test messages: junit ids of tests under the checkout)
    assert "1 failed, 1 passed" in report["summary"] and report["provenance"]["git"]["sha"]
