# SPDX-License-Identifier: Apache-2.0
"""The README's measured blocks are what scripts/readme_results.py renders from benchmarks/results/."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("readme_results", ROOT / "scripts" / "readme_results.py")
readme_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_results)


def test_readme_blocks_match_results_files(capsys):
    rc = readme_results.main(["--check"])
    out = capsys.readouterr()
    assert rc == 0, f"README blocks are stale or unregistered; run python scripts/readme_results.py\n{out.out}{out.err}"


def test_a_changed_results_file_fails_the_check(tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    acc = results / "acceptance_smollm2.json"
    data = json.loads(acc.read_text())
    data["humaneval"]["block_sizes"]["16"]["tau_greedy"] = 3.51
    acc.write_text(json.dumps(data))
    readme = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    assert readme_results.main(["--check", "--readme", str(readme), "--results", str(results)]) == 1
    assert "| HumanEval | 164 | 3.51 |" in capsys.readouterr().out      # the diff names the new figure
    assert readme_results.main(["--readme", str(readme), "--results", str(results)]) == 0   # rewrite ...
    assert readme_results.main(["--check", "--readme", str(readme), "--results", str(results)]) == 0  # ... fixes it
    assert "| HumanEval | 164 | 3.51 |" in readme.read_text()


def test_unregistered_and_missing_blocks_are_reported(tmp_path, capsys):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    start, end = text.index("<!-- results:training -->"), text.index("<!-- /results:training -->")
    readme.write_text(text[:start] + text[end + len("<!-- /results:training -->"):]
                      + "\n<!-- results:made_up -->\n1.23\n<!-- /results:made_up -->\n")
    assert readme_results.main(["--check", "--readme", str(readme)]) == 1
    err = capsys.readouterr().err
    assert "'made_up' has no renderer" in err and "renderer 'training' has no block" in err


def test_provenance_note_names_the_sha_or_says_legacy():
    assert readme_results.provenance_note({}, "x.json") == "`benchmarks/results/x.json`, legacy: no git SHA recorded"
    rec = {"provenance": {"git": {"sha": "0123456789abcdef", "dirty": True, "diff_sha256": "fedcba9876543210"}}}
    assert readme_results.provenance_note(rec, "x.json") == (
        "`benchmarks/results/x.json`, git 0123456789, dirty tree, diff sha256 fedcba9876")
