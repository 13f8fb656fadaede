# SPDX-License-Identifier: Apache-2.0
"""The README's measured blocks are what scripts/readme_results.py renders from benchmarks/results/."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("readme_results", ROOT / "scripts" / "readme_results.py")
readme_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_results)


def test_readme_blocks_match_results_files(capsys):
    rc = readme_results.main(["--check"])
    out = capsys.readouterr()
    assert rc == 0, f"README blocks are stale or unregistered; run python scripts/readme_results.py\n{out.out}{out.err}"


def _copies(tmp_path):
    results, readme = tmp_path / "results", tmp_path / "README.md"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    shutil.copy(ROOT / "README.md", readme)
    return results, readme


def _edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_changed_results_file_fails_the_check(tmp_path, capsys):
    results, readme = _copies(tmp_path)
    _edit(results / "cuda_check_h100.json", lambda d: d["tiny"][0].update(dflash_eq_ar_greedy=5))
    assert readme_results.main(["--check", "--readme", str(readme), "--results", str(results)]) == 1
    assert "| tiny random llama | float32 | 6 | 5/6 |" in capsys.readouterr().out   # the diff names the new figure
    assert readme_results.main(["--readme", str(readme), "--results", str(results)]) == 0   # rewrite ...
    assert readme_results.main(["--check", "--readme", str(readme), "--results", str(results)]) == 0  # ... fixes it
    assert "| tiny random llama | float32 | 6 | 5/6 |" in readme.read_text()


def _drop_commits(d):
    d.pop("git_sha", None), d.pop("git_sha_note", None), d["provenance"].pop("git_sha", None)
    d["provenance"]["git"] = {"sha": None, "dirty": None}


def test_a_results_file_without_a_commit_in_the_history_is_not_quoted(tmp_path, capsys):
    results, readme = _copies(tmp_path)
    quoted = "Ops per decoder layer in a decode step"
    assert quoted in readme.read_text()
    for change, why in ((_drop_commits, "records no commit"),
                        (lambda d: d.update(git_sha="f" * 40), "records commit ffffffffff, which is not in this "
                                                               "repository's history"),
                        (lambda d: d["provenance"]["git"].update(sha="HEAD"), "records 'HEAD', not a commit SHA")):
        shutil.copy(ROOT / "benchmarks" / "results" / "layer_op_counts.json", results / "layer_op_counts.json")
        _edit(results / "layer_op_counts.json", change)
        assert readme_results.main(["--readme", str(readme), "--results", str(results)]) == 0
        text = readme.read_text()
        assert quoted not in text and "benchmarks/results/layer_op_counts.json" not in text
        assert ("*Ops per decoder layer: awaits a re-measurement with provenance* (the last one, "
                f"`layer_op_counts.json`, {why})") in " ".join(text.split())
        shutil.copy(ROOT / "README.md", readme)
    capsys.readouterr()


def test_the_readme_may_not_quote_a_results_file_without_a_commit(tmp_path, capsys):
    results, readme = _copies(tmp_path)
    readme.write_text(readme.read_text() + "\nSee `benchmarks/results/step_bench_h100_v1.json` and "
                      "`benchmarks/results/sweep_smollm2_untrained_h100/pareto.png` and benchmarks/results/nothing.json.\n")
    assert readme_results.main(["--check", "--readme", str(readme), "--results", str(results)]) == 1
    err = capsys.readouterr().err
    assert ("the README quotes benchmarks/results/step_bench_h100_v1.json, but benchmarks/results/step_bench_h100_v1.json "
            "records no commit: re-measure it, or stop quoting it") in err
    assert ("the README quotes benchmarks/results/sweep_smollm2_untrained_h100/pareto.png, but "
            "benchmarks/results/sweep_smollm2_untrained_h100.jsonl records no commit") in err
    assert "the README names benchmarks/results/nothing.json, which does not exist" in err


def test_every_results_file_the_readme_quotes_records_a_commit_in_the_history():
    text = (ROOT / "README.md").read_text()
    quoted = set(readme_results.QUOTE.findall(text))
    assert len(quoted) >= 8, quoted                # the check below looks at something
    assert readme_results.quote_problems(text, ROOT / "benchmarks" / "results") == []


def test_recorded_commits_are_found_at_any_depth():
    data = [{"git_sha": "a" * 40, "trees": {"this": {"git": {"sha": "b" * 40}}}}, {"meta": {"git": "HEAD"}},
            {"versions": {"git_sha": "c" * 7 + "-dirty"}}]
    assert readme_results.recorded_commits(data) == ["a" * 40, "b" * 40, "HEAD", "c" * 7 + "-dirty"]
    assert readme_results.commit_problem({"provenance": {"git": {"sha": None}}}) == "records no commit"


def test_history_that_git_cannot_see_stops_the_check(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *a, cwd=repo: subprocess.run(["git", *a], cwd=cwd, check=True, capture_output=True, text=True)  # noqa: E731
    git("init", "-q")
    for i in range(2):
        (repo / "f").write_text(str(i))
        git("add", "f")
        git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", str(i))
    first, head = git("rev-list", "--reverse", "HEAD").stdout.split()
    assert readme_results.in_history(first, repo) and not readme_results.in_history("f" * 40, repo)
    git("clone", "-q", "--depth", "1", f"file://{repo}", "shallow", cwd=tmp_path)
    shallow = tmp_path / "shallow"
    assert readme_results.in_history(head, shallow)
    with pytest.raises(readme_results.HistoryUnavailable, match="git fetch --unshallow"):
        readme_results.in_history(first, shallow)
    with pytest.raises(readme_results.HistoryUnavailable, match="not a git checkout"):
        readme_results.in_history(first, tmp_path / "nowhere")


def test_unregistered_and_missing_blocks_are_reported(tmp_path, capsys):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    start, end = text.index("<!-- results:training -->"), text.index("<!-- /results:training -->")
    readme.write_text(text[:start] + text[end + len("<!-- /results:training -->"):]
                      + "\n<!-- results:made_up -->\n1.23\n<!-- /results:made_up -->\n")
    assert readme_results.main(["--check", "--readme", str(readme)]) == 1
    err = capsys.readouterr().err
    assert "'made_up' has no renderer" in err and "renderer 'training' has no block" in err


def test_provenance_note_names_the_sha_or_refuses_a_file_without_one():
    with pytest.raises(readme_results.NoCommit, match="x.json records no commit"):
        readme_results.provenance_note({}, "x.json")
    rec = {"provenance": {"git": {"sha": "0123456789abcdef", "dirty": True, "diff_sha256": "fedcba9876543210"}}}
    assert readme_results.provenance_note(rec, "x.json") == (
        "`benchmarks/results/x.json`, git 0123456789, dirty tree, diff sha256 fedcba9876")


def test_the_readme_opens_with_one_measured_table():
    """A new reader meets what the tool does, then figures (each from a results file), before any command."""
    lines = (ROOT / "README.md").read_text().splitlines()
    first_block = next(i for i, ln in enumerate(lines) if ln.startswith("<!-- results:"))
    first_code = next(i for i, ln in enumerate(lines) if ln.startswith("```"))
    assert lines[first_block] == "<!-- results:headline -->" and first_block < first_code <= 20
    table = lines[first_block + 1:lines.index("<!-- /results:headline -->")]
    assert table[0].startswith("| measured |") and len(table) == 6   # header, separator, four rows
    assert sum("x at concurrency" in row or " ms" in row for row in table) >= 2   # figures, not only placeholders


def test_a_result_names_the_drafter_it_measured_not_the_one_shipped_now():
    results = ROOT / "benchmarks" / "results"
    shipped = readme_results._read(results, readme_results.DRAFTER_RUN + "/summary.json")["checkpoints"][
        "drafter_shipped_sha256"]

    def made_with(sha):
        return {"provenance": {"checkpoints": {"drafter": {"files": {"model.safetensors": sha}}}}}
    v2 = readme_results._read(results, "train_smollm2_10x_h200/summary.json")["checkpoints"]["drafter_shipped_sha256"]
    assert readme_results.smollm2_drafter(results, made_with(shipped), "drafter") == "the shipped drafter"
    assert readme_results.smollm2_drafter(results, made_with(v2), "drafter") == "the v2 drafter"
    assert readme_results.smollm2_drafter(results, made_with("ab" * 32), "drafter") == "a drafter with sha256 abababababab"
    assert readme_results.smollm2_drafter(results, {}, "drafter") == "a drafter the file does not name"
