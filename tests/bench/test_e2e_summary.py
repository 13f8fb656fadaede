# SPDX-License-Identifier: Apache-2.0
"""trtllm_dflash/bench/e2e_summary.py: DFlash / AR per (dataset, concurrency) and path (in-process, dflash-openai)."""
from __future__ import annotations

import hashlib
import json

from trtllm_dflash.bench import e2e_summary


def _row(server, dataset, c, mode, tok_s_user, tok_s_gpu=None, al=None):
    return {"settings": {"server": server, "dataset": dataset, "concurrency": c, "mode": mode},
            "metrics": {"tok_s_user": tok_s_user, "tok_s_gpu": tok_s_gpu, "acceptance_length_mean": al}}


def test_ratios_per_path_and_the_worst_adaptive_level():
    rows = [_row("engine", "humaneval", 1, "ar", 1000.0), _row("engine", "humaneval", 1, "dflash", 2500.0, al=3.6),
            _row("engine", "humaneval", 1, "adaptive", 2400.0),
            _row("engine", "humaneval", 64, "ar", 400.0), _row("engine", "humaneval", 64, "adaptive", 380.0),
            _row("openai", "humaneval", 1, "ar", 800.0), _row("openai", "humaneval", 1, "dflash", 1600.0),
            _row("openai", "humaneval", 1, "adaptive", 1700.0)]
    s = e2e_summary.summarize(rows)
    assert s["dflash_over_ar_tok_s_b1_humaneval"] == 2.5
    assert s["adaptive_over_ar_tok_s_b1_humaneval"] == 2.4
    assert s["dflash_over_ar_tok_s_b1_humaneval_openai"] == 2.0
    assert s["adaptive_over_ar_tok_s_b1_humaneval_openai"] == 2.125
    assert s["min_adaptive_over_ar_inprocess"] == 0.95 and s["min_adaptive_over_ar_openai"] == 2.125
    assert s["levels"]["humaneval_c1"]["inprocess"]["dflash"]["acceptance_length"] == 3.6
    assert s["dflash_over_ar_tok_s_b1_mtbench"] is None      # not measured: no figure rather than a guess
    # the grid the rows span: DFlash fixed at 64 and every mode through dflash-openai at 64 have no row
    assert s["missing"] == ["humaneval_c64 inprocess dflash", "humaneval_c64 openai ar",
                            "humaneval_c64 openai dflash", "humaneval_c64 openai adaptive"]


def test_a_cut_short_run_says_what_it_lacks_and_carries_its_notes(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(_row(srv, "humaneval", 1, m, 1000.0)) for srv, m in
                              [("engine", "ar"), ("engine", "dflash"), ("engine", "adaptive"),
                               ("openai", "ar"), ("openai", "dflash")]) + "\n")
    out = tmp_path / "s.json"
    assert e2e_summary.main(["--sweep", str(rows), "--out", str(out), "--note", "stopped by the time limit"]) == 0
    s = json.loads(out.read_text())["summary"]
    assert s["missing"] == ["humaneval_c1 openai adaptive"] and s["notes"] == ["stopped by the time limit"]
    assert s["adaptive_over_ar_tok_s_b1_humaneval_openai"] is None


def test_rows_written_before_the_server_setting_count_by_their_backend_setting():
    rows = [_row("openai", "humaneval", 1, "ar", 800.0), _row("openai", "humaneval", 1, "dflash", 1600.0)]
    for r in rows:
        r["settings"]["backend"] = r["settings"].pop("server")
    assert e2e_summary.summarize(rows)["dflash_over_ar_tok_s_b1_humaneval_openai"] == 2.0


def test_main_refuses_an_empty_sweep(tmp_path, capsys):
    empty = tmp_path / "rows.jsonl"
    empty.write_text("")
    assert e2e_summary.main(["--sweep", str(empty), "--out", str(tmp_path / "out.json")]) == 2
    assert "holds no rows" in capsys.readouterr().err
    rows = tmp_path / "r.jsonl"
    rows.write_text(json.dumps(_row("engine", "mtbench", 1, "ar", 10.0)) + "\n")
    assert e2e_summary.main(["--sweep", str(rows), "--out", str(tmp_path / "out.json")]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["provenance"]["git"]["sha"]


def test_sweeps_of_several_datasets_are_joined(tmp_path):
    files = []
    for dataset, dflash in (("humaneval", 20.0), ("mtbench", 15.0)):
        f = tmp_path / f"{dataset}.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in (_row("engine", dataset, 1, "ar", 10.0),
                                                            _row("engine", dataset, 1, "dflash", dflash))))
        files.append(str(f))
    assert e2e_summary.main(["--sweep", *files, "--out", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert len(out["rows"]) == 4
    assert out["summary"]["dflash_over_ar_tok_s_b1_humaneval"] == 2.0
    assert out["summary"]["dflash_over_ar_tok_s_b1_mtbench"] == 1.5


def test_served_over_in_process_per_mode_and_the_headline_at_64():
    rows = [_row("engine", "humaneval", 64, "ar", 400.0, tok_s_gpu=30000.0),
            _row("engine", "humaneval", 64, "dflash", 380.0, tok_s_gpu=26000.0),
            _row("openai", "humaneval", 64, "ar", 250.0, tok_s_gpu=18000.0),
            _row("openai", "humaneval", 64, "dflash", 360.0, tok_s_gpu=23400.0),
            _row("openai", "mtbench", 64, "ar", 250.0, tok_s_gpu=18000.0)]
    s = e2e_summary.summarize(rows, api_server_count=4)
    assert s["levels"]["humaneval_c64"]["openai_over_inprocess"] == {"ar": 0.6, "dflash": 0.9}
    assert s["openai_over_inprocess_ar_c64_humaneval"] == 0.6 and s["api_server_count"] == 4
    assert s["openai_over_inprocess_ar_c64_mtbench"] is None     # no in-process row to compare with


def test_the_deployment_served_names_its_checkpoints_in_the_provenance(tmp_path, capsys):
    rows = tmp_path / "r.jsonl"
    rows.write_text(json.dumps(_row("engine", "humaneval", 1, "ar", 10.0)) + "\n")
    deploy = tmp_path / "deploy"
    for role, data in (("target", b"t"), ("drafter", b"d")):
        (deploy / role).mkdir(parents=True)
        (deploy / role / "model.safetensors").write_bytes(data)
    assert e2e_summary.main(["--sweep", str(rows), "--out", str(tmp_path / "out.json"),
                             "--deployment_dir", str(deploy)]) == 0
    ck = json.loads((tmp_path / "out.json").read_text())["provenance"]["checkpoints"]
    assert ck["drafter"]["files"]["model.safetensors"] == hashlib.sha256(b"d").hexdigest()
    assert ck["target"]["files"]["model.safetensors"] == hashlib.sha256(b"t").hexdigest()
    assert e2e_summary.main(["--sweep", str(rows), "--out", str(tmp_path / "o2.json"),
                             "--deployment_dir", str(tmp_path / "nowhere")]) == 2
    assert "--deployment_dir" in capsys.readouterr().err and not (tmp_path / "o2.json").exists()
