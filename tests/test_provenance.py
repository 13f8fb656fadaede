# SPDX-License-Identifier: Apache-2.0
"""Provenance records: git state from git or from the file left for a copy without .git; checkpoint digests."""
from __future__ import annotations

import json
import shutil
import subprocess

from trtllm_dflash import provenance


def _repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    run = lambda *a: subprocess.run(["git", "-C", str(root), *a], check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (root / "a.txt").write_text("one\n")
    run("add", "a.txt")
    run("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x")
    return root


def test_git_state_clean_then_dirty(tmp_path):
    root = _repo(tmp_path)
    clean = provenance.git_state(root)
    assert clean["dirty"] is False and clean["diff_sha256"] is None and len(clean["sha"]) == 40
    (root / "a.txt").write_text("two\n")
    dirty = provenance.git_state(root)
    assert dirty["sha"] == clean["sha"] and dirty["dirty"] is True
    assert dirty["diff_sha256"] == provenance.git_state(root)["diff_sha256"]      # same tree, same hash
    (root / "a.txt").write_text("three\n")
    assert provenance.git_state(root)["diff_sha256"] != dirty["diff_sha256"]


def test_state_file_stands_in_for_git(tmp_path):
    root = _repo(tmp_path)
    want = provenance.git_state(root)
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".git"))
    assert provenance.git_state(copy)["sha"] is None
    (copy / provenance.STATE_FILE).write_text(json.dumps({k: v for k, v in want.items() if k != "source"}))
    got = provenance.git_state(copy)
    assert got["sha"] == want["sha"] and got["source"] == provenance.STATE_FILE


def test_checkpoint_digest_changes_with_any_file(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"abc")
    first = provenance.checkpoint_digest(d)
    assert set(first["files"]) == {"config.json", "model.safetensors"}
    (d / "model.safetensors").write_bytes(b"abd")
    assert provenance.checkpoint_digest(d)["sha256"] != first["sha256"]


def test_record_names_command_versions_and_checkpoints(tmp_path):
    f = tmp_path / "w.bin"
    f.write_bytes(b"123")
    rec = provenance.record(["bench.py", "--x", "1"], checkpoints={"drafter": f, "none": None})
    assert rec["command"] == "bench.py --x 1" and set(rec["checkpoints"]) == {"drafter"}
    assert rec["versions"]["torch"] and rec["git"]["sha"] and "device" in rec


def test_copy_inside_another_checkout_uses_its_state_file(tmp_path):
    outer = _repo(tmp_path)                       # a checkout with its .git
    inner = outer / "vendor" / "tree"             # another tree copied inside it, without .git
    inner.mkdir(parents=True)
    (inner / provenance.STATE_FILE).write_text(json.dumps({"sha": "f" * 40, "dirty": False, "diff_sha256": None}))
    got = provenance.git_state(inner)
    assert got["sha"] == "f" * 40 and got["source"] == provenance.STATE_FILE


def test_state_file_wins_over_a_git_that_describes_other_code(tmp_path):
    root = _repo(tmp_path)    # the GPU host's copy: a .git of an older snapshot beside the carried state file
    (root / provenance.STATE_FILE).write_text(json.dumps({"sha": "e" * 40, "dirty": False, "diff_sha256": None}))
    assert provenance.git_state(root)["sha"] == "e" * 40


def test_a_state_file_left_in_the_checkout_that_moved_on_gives_way_to_git(tmp_path):
    # written here for a copy, then left behind: a later run in this checkout must name its own commit
    root = _repo(tmp_path)
    first = provenance.git_state(root)
    (root / provenance.STATE_FILE).write_text(json.dumps({k: v for k, v in first.items() if k != "source"}))
    (root / "b.txt").write_text("b\n")
    run = lambda *a: subprocess.run(["git", "-C", str(root), *a], check=True, capture_output=True)  # noqa: E731
    run("add", "b.txt")
    run("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "y")
    now = provenance.git_state(root)
    assert now["source"] == "git" and now["sha"] != first["sha"]


def test_a_copy_at_the_same_commit_with_carried_files_reads_the_state_file(tmp_path):
    # the GPU host's copy: its own .git at the same commit, and files carried beside the tree that it calls untracked
    root = _repo(tmp_path)
    written = {"sha": provenance.git_state(root)["sha"], "dirty": False, "diff_sha256": None, "checkout": "1:2"}
    (root / provenance.STATE_FILE).write_text(json.dumps(written))
    (root / "carried.bin").write_text("x\n")
    got = provenance.git_state(root)
    assert got == {"sha": written["sha"], "dirty": False, "diff_sha256": None, "source": provenance.STATE_FILE}


def test_write_names_the_checkout_so_its_own_edits_still_count(tmp_path):
    root = _repo(tmp_path)
    state = {**provenance.git_state(root), "checkout": provenance._checkout_id(root)}
    (root / provenance.STATE_FILE).write_text(json.dumps(state))
    (root / "a.txt").write_text("edited\n")
    got = provenance.git_state(root)
    assert got["source"] == "git" and got["dirty"]
