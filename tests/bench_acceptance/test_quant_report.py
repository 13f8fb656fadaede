# SPDX-License-Identifier: Apache-2.0
"""trtllm_dflash/bench/quant_report.py on a tiny chat target quantized to FP8 by dflash-build on CPU: the report is
written with its provenance (command, git state, versions, sha256 of both targets and the drafter)."""
from __future__ import annotations

import json

import pytest
import torch

from trtllm_dflash import cli
from trtllm_dflash.checkpoints.drafter_init import write_random_drafter
from trtllm_dflash.provenance import checkpoint_digest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _load_script():
    from trtllm_dflash.bench import quant_report
    return quant_report


def test_quant_report_records_provenance(tmp_path):
    pytest.importorskip("modelopt.torch.quantization", reason="NVIDIA ModelOpt (the [quant] extra)")
    from tests.bench_acceptance.tiny_chat import write_tiny_chat_target
    target = write_tiny_chat_target(tmp_path / "target")
    drafter = write_random_drafter(target, tmp_path / "drafter", num_layers=1, block_size=4, target_layer_ids=[1, 2],
                                   mask_token_id=259, dtype=torch.float32)
    quant = tmp_path / "fp8"
    assert cli.build_main(["--target", str(target), "--drafter", str(drafter), "--max_seq_len", "256", "--out",
                           str(quant), "--calib_data", "random", "--calib_size", "2", "--quant", "fp8"]) == 0
    out = tmp_path / "quant.json"
    assert _load_script().main(["--base", str(target), "--quant", str(quant), "--drafter", str(drafter), "--n", "1",
                                "--max_new_tokens", "4", "--no_act_emulation", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    prov = res["provenance"]
    assert prov["command"] == res["command"] and prov["git"]["sha"] and prov["versions"]["nvidia-modelopt"]
    assert prov["checkpoints"]["drafter"]["sha256"] == checkpoint_digest(drafter)["sha256"]
    assert prov["checkpoints"]["base_target"]["sha256"] == checkpoint_digest(target)["sha256"]
    assert prov["checkpoints"]["quant_target"]["sha256"] == checkpoint_digest(quant / "target")["sha256"]


def test_target_of_reads_a_deployment_through_its_manifest_and_takes_a_plain_folder_as_the_target(tmp_path):
    from trtllm_dflash.deployment import Deployment
    from trtllm_dflash.errors import DFlashError
    quant_report = _load_script()
    plain = tmp_path / "plain"
    plain.mkdir()
    assert quant_report.target_of(plain) == (plain, None)
    built = tmp_path / "built"
    built.mkdir()
    Deployment.write(built, {"backend": "torch", "target": {"path": "weights"}})
    target, manifest = quant_report.target_of(built)
    assert target == built.absolute() / "weights"
    assert manifest["target"] == {"path": "weights"}
    # the one reader checks the manifest: a stale format is refused, not read past
    (built / "manifest.json").write_text(json.dumps({"backend": "torch", "format_version": 0}))
    with pytest.raises(DFlashError, match="format_version"):
        quant_report.target_of(built)
