# SPDX-License-Identifier: Apache-2.0
"""The run's tau curve (trtllm_dflash/training/report.py): an acceptance result is filed under the step and token
count it was measured at, from the checkpoint or, for a run copied without one, from report.json."""
from __future__ import annotations

import json

import pytest

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.training import report

ACCEPTANCE = {"humaneval": {"tau_greedy": 1.94, "tau_t1": 1.46}, "mtbench": {"tau_greedy": 2.01, "tau_t1": 1.26}}


def test_tau_is_filed_under_the_checkpoint_or_the_reports_training(tmp_path):
    with pytest.raises(DFlashError, match="checkpoint/state.json"):
        report.add_tau(tmp_path, ACCEPTANCE)
    (tmp_path / report.REPORT_FILE).write_text(json.dumps({"train": {"steps": 1243, "tokens": 22143195}}))
    row = report.add_tau(tmp_path, ACCEPTANCE)      # evaluated on another host: no checkpoint came along
    assert (row["step"], row["tokens"], row["humaneval_tau_greedy"]) == (1243, 22143195, 1.94)
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "state.json").write_text(json.dumps({"step": 500, "tokens": 9000000}))
    report.add_tau(tmp_path, {"humaneval": {"tau_greedy": 1.5}})   # a checkpoint, when present, names the step
    assert [(r["step"], r.get("humaneval_tau_greedy")) for r in report.read_tau(tmp_path)] == [(500, 1.5),
                                                                                              (1243, 1.94)]
