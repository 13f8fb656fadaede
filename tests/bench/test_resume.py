# SPDX-License-Identifier: Apache-2.0
"""trtllm_dflash/bench/resume.py: a sweep whose label has every level is skipped; one cut short is dropped."""
from __future__ import annotations

import json

from trtllm_dflash.bench import resume


def _rows(path, *runs):
    path.write_text("".join(json.dumps({"label": label, "settings": {"concurrency": c}}) + "\n" for label, c in runs))


def test_a_label_with_every_level_is_complete_and_the_file_is_untouched(tmp_path):
    rows = tmp_path / "rows.jsonl"
    _rows(rows, ("AR", 1), ("AR", 4), ("DFlash", 1))
    before = rows.read_text()
    assert resume.main([str(rows), "AR", "1,4"]) == 0
    assert rows.read_text() == before


def test_a_sweep_cut_short_loses_its_rows_and_runs_again(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    _rows(rows, ("AR", 1), ("AR", 4), ("DFlash", 1))
    assert resume.main([str(rows), "DFlash", "1,4"]) == 1
    assert [json.loads(line)["label"] for line in rows.read_text().splitlines()] == ["AR", "AR"]
    assert resume.main([str(rows), "DFlash adaptive", "1"]) == 1          # never ran: nothing to drop
    assert resume.main([str(tmp_path / "none.jsonl"), "AR", "1"]) == 1   # no file yet: run everything
    assert not (tmp_path / "none.jsonl").exists()
    assert "RESUME" not in capsys.readouterr().err
