# SPDX-License-Identifier: Apache-2.0
"""trtllm_dflash/bench/acceptance.py on a tiny chat target with real HumanEval / MT-Bench prompts (CPU): the JSON schema,
the README table, and the cross-check against the `dflash` reference package."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trtllm_dflash.checkpoints.drafter_init import write_random_drafter



def _load_script():
    from trtllm_dflash.bench import acceptance
    return acceptance


acceptance = _load_script()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    from tests.bench_acceptance.tiny_chat import write_tiny_chat_target

    root = tmp_path_factory.mktemp("pair")
    target = write_tiny_chat_target(root / "target")
    drafter = write_random_drafter(target, root / "drafter", num_layers=1, block_size=8, target_layer_ids=[1, 2],
                                   mask_token_id=259, dtype=torch.float32)
    return target, drafter


def _argv(pair, out, *extra):
    return ["--target", str(pair[0]), "--drafter", str(pair[1]), "--out", str(out), "--n", "2",
            "--max_new_tokens", "24", "--block_sizes", "8", "4", "--quiet", *extra]


def test_tau_is_z_labs_per_request_mean():
    assert acceptance.request_tau(1, 0) is None                  # stopped at the first token: no verify ran
    assert acceptance.request_tau(13, 4) == 3.0                  # 12 tokens after prefill over 4 verifies
    assert acceptance.mean_tau([(13, 4), (5, 4), (1, 0)]) == 2.0  # mean over requests that verified


def test_results_schema_table_and_reference_agree(pair, tmp_path, capsys):
    pytest.importorskip("dflash.model", reason="the dflash reference package (pip install --no-deps dflash)")
    out = tmp_path / "res" / "acceptance_tiny.json"
    assert acceptance.main(_argv(pair, out, "--reference", "--reference_n", "2")) == 0
    res = json.loads(out.read_text())
    assert set(res) == {"humaneval", "mtbench"}
    for name, r in res.items():
        assert r["n_prompts"] == 2 and r["block_size"] == 8 and set(r["block_sizes"]) == {"8", "4"}
        assert r["tau_greedy"] == r["block_sizes"]["8"]["tau_greedy"] and 1.0 <= r["tau_greedy"] <= 8.0
        assert 1.0 <= r["tau_t1"] <= 8.0
        ref = r["reference"]
        assert ref["identical_outputs"] == 2 and ref["ratio"] == 1.0 and ref["within_tolerance"], (name, ref)
        for bs, entry in r["block_sizes"].items():   # the per-prompt counts give the block's tau back
            assert len(entry["greedy_per_prompt"]) == 2
            assert acceptance.mean_tau([tuple(x) for x in entry["greedy_per_prompt"]]) == entry["tau_greedy"], bs
    from trtllm_dflash.bench.acceptance_compare import compare
    same = compare(res, res, "a", "b", 8)
    assert all(c["mean_diff"] == 0 and c["equal"] == 2 and c["output_length_differs"] == 0 for c in same.values())
    table = out.with_suffix(".md").read_text().splitlines()
    assert table[0].startswith("| dataset | prompts | B=8 greedy | B=8 T=1 | B=4 greedy") and len(table) == 4
    meta = json.loads((out.parent / "acceptance_tiny.meta.json").read_text())
    assert meta["command"].startswith("python -m trtllm_dflash.bench.acceptance --target") and meta["device"].startswith("cpu")
    assert "| humaneval | 2 |" in capsys.readouterr().out


def test_reference_mismatch_fails_the_run(pair, tmp_path, monkeypatch, capsys):
    def off_by_one_step(*args, **kw):  # a "reference" that needs one verify more per request
        prompts = args[2]
        return [(25, 25, [0] * 25) for _ in prompts]

    monkeypatch.setattr(acceptance, "run_reference", off_by_one_step)
    out = tmp_path / "a.json"
    assert acceptance.main(_argv(pair, out, "--datasets", "mtbench", "--block_sizes", "8", "--reference",
                                 "--reference_n", "1")) == 1
    assert json.loads(out.read_text())["mtbench"]["reference"]["within_tolerance"] is False
    assert "error: mtbench: tau ours / reference" in capsys.readouterr().err


def test_missing_drafter_is_one_line(pair, tmp_path):
    from trtllm_dflash.errors import DFlashError

    with pytest.raises(DFlashError, match="has no config.json"):
        acceptance.main(["--target", str(pair[0]), "--drafter", str(tmp_path), "--out", str(tmp_path / "x.json")])


def test_meta_records_provenance_with_the_checkpoint_digests(pair, tmp_path):
    out = tmp_path / "acceptance_tiny.json"
    assert acceptance.main(["--target", str(pair[0]), "--drafter", str(pair[1]), "--out", str(out), "--n", "1",
                            "--datasets", "mtbench", "--max_new_tokens", "8", "--block_sizes", "4", "--quiet"]) == 0
    from trtllm_dflash.provenance import checkpoint_digest
    meta = json.loads(out.with_name("acceptance_tiny.meta.json").read_text())
    prov = meta["provenance"]
    assert prov["command"] == meta["command"] and prov["git"]["sha"] and prov["versions"]["torch"]
    assert prov["checkpoints"]["drafter"]["sha256"] == checkpoint_digest(pair[1])["sha256"]
    assert prov["checkpoints"]["target"]["sha256"] == checkpoint_digest(pair[0])["sha256"]


def test_ar_check_counts_identical_outputs_on_every_prompt(pair, tmp_path):
    out = tmp_path / "acceptance_ar.json"
    assert acceptance.main(_argv(pair, out, "--datasets", "humaneval", "mtbench", "--ar_check")) == 0
    for name in ("humaneval", "mtbench"):
        check = json.loads(out.read_text())[name]["ar_check"]
        assert check == {"n_prompts": 2, "block_size": 8, "dtype": "float32", "identical_outputs": 2,
                         "differing_prompts": []}


def test_ar_check_fails_the_run_when_dflash_differs_from_ar(pair, tmp_path, monkeypatch, capsys):
    real = acceptance.run_ours

    def ar_one_token_off(target_dir, drafter_dir, prompts, block_size, temperatures, args, dtype):
        run = real(target_dir, drafter_dir, prompts, block_size, temperatures, args, dtype)
        if block_size == 1:   # the AR side: the second prompt's last token changed
            rows = run["results"][("mtbench", 0.0)]
            n, s, ids = rows[1]
            rows[1] = (n, s, ids[:-1] + [ids[-1] + 1])
        return run

    monkeypatch.setattr(acceptance, "run_ours", ar_one_token_off)
    out = tmp_path / "acceptance_ar_off.json"
    assert acceptance.main(_argv(pair, out, "--datasets", "mtbench", "--block_sizes", "4", "--ar_check")) == 1
    assert json.loads(out.read_text())["mtbench"]["ar_check"]["differing_prompts"] == [1]
    assert "error: mtbench: DFlash != AR in float32 on 1 of 2 prompts" in capsys.readouterr().err
