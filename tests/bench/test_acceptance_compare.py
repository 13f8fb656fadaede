# SPDX-License-Identifier: Apache-2.0
"""acceptance_compare: per-prompt pairing of two acceptance runs, its interval and its refusals."""
from __future__ import annotations

import hashlib
import json

import pytest

from trtllm_dflash.bench.acceptance_compare import bootstrap_ci, compare, main
from trtllm_dflash.errors import DFlashError, exit_code


def run(per_prompt, block="16"):
    taus = [(n - 1) / s for n, s in per_prompt]
    return {"humaneval": {"tau_greedy": sum(taus) / len(taus), "block_sizes": {block: {"greedy_per_prompt": per_prompt}}}}


def test_a_drafter_better_on_every_prompt_is_higher_beyond_the_spread():
    a = run([[101, 50], [201, 80], [65, 32], [129, 40]])        # tau 2.0, 2.5, 2.0, 3.2
    b = run([[101, 40], [201, 64], [65, 16], [129, 32]])        # tau 2.5, 3.125, 4.0, 4.0
    r = compare(a, b, "a", "b", 16)["humaneval"]
    assert r["b_higher"] == 4 and r["b_lower"] == r["equal"] == 0 and r["ci95"][0] > 0
    assert r["verdict"] == "B higher" and r["mean_diff"] == pytest.approx((0.5 + 0.625 + 2.0 + 0.8) / 4, abs=1e-4)
    assert compare(b, a, "b", "a", 16)["humaneval"]["verdict"] == "B lower"


def test_mixed_changes_are_no_difference_and_length_changes_are_counted():
    a = run([[101, 50], [201, 80], [65, 32], [129, 40]])
    b = run([[101, 40], [201, 100], [65, 32], [130, 40]])       # up, down, equal, a longer output
    r = compare(a, b, "a", "b", 16)["humaneval"]
    assert (r["b_higher"], r["b_lower"], r["equal"], r["output_length_differs"]) == (2, 1, 1, 1)
    assert r["verdict"] == "no difference beyond the prompts' spread" and r["ci95"][0] < 0 < r["ci95"][1]


def test_bootstrap_interval_is_seeded_and_holds_the_mean():
    diffs = [0.1, -0.2, 0.3, 0.05, 0.0, 0.4]
    lo, hi = bootstrap_ci(diffs)
    assert (lo, hi) == bootstrap_ci(diffs) and lo < sum(diffs) / len(diffs) < hi


@pytest.mark.parametrize("b, field, words", [
    (run([[101, 50]]), "b.json", "1 prompts"),
    (run([[101, 50], [201, 80]], block="8"), "b.json", "no block size 16"),
    ({"humaneval": {"block_sizes": {"16": {"tau_greedy": 2.0}}}}, "b.json", "no per-prompt counts"),
    ({"mtbench": {"block_sizes": {}}}, "b.json", "has no humaneval"),
])
def test_refusals_name_the_file(b, field, words):
    a = run([[101, 50], [201, 80]])
    with pytest.raises(DFlashError) as err:
        compare(a, b, "a.json", "b.json", 16)
    assert err.value.field == field and words in str(err.value) and "\n" not in str(err.value)


def test_cli_writes_json_and_table_and_a_missing_file_is_one_line(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(run([[101, 50], [201, 80]])))
    b.write_text(json.dumps(run([[101, 40], [201, 64]])))
    assert main([str(a), str(b), "--out", str(tmp_path / "cmp.json")]) == 0
    assert "| humaneval | 2 |" in capsys.readouterr().out
    written = json.loads((tmp_path / "cmp.json").read_text())
    assert written["provenance"]["git"]["sha"] and written["provenance"]["inputs_sha256"]["b"] == hashlib.sha256(
        b.read_bytes()).hexdigest()
    saved = json.loads((tmp_path / "cmp.json").read_text())
    assert saved["greedy"]["humaneval"]["b_higher"] == 2 and (tmp_path / "cmp.md").is_file()
    assert exit_code(main, [str(tmp_path / "none.json"), str(b)]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_a_file_without_results_is_refused_not_compared_as_empty():
    meta = {"command": "python -m trtllm_dflash.bench.acceptance ...", "timings_s": {}}
    with pytest.raises(DFlashError) as err:
        compare(meta, run([[101, 50]]), "a.meta.json", "b.json", 16)
    assert err.value.field == "a.meta.json" and "no dataset results" in str(err.value)
