# SPDX-License-Identifier: Apache-2.0
import re

import pytest
import yaml

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving import protocol
from trtllm_dflash.serving.repo import MODEL_NAME, fill_template, fill_triton, template_dir

MANIFEST = {"backend": "torch", "tp_size": 1, "runtime": {"max_batch_size": 4, "max_seq_len": 128}}


def _names(pbtxt: str, section: str) -> list[str]:
    block = pbtxt.split(f"\n{section} [", 1)[1].split("\n]", 1)[0]
    return re.findall(r'name: "(\w+)"', block)


def test_template_names_match_protocol():
    pbtxt = (template_dir() / MODEL_NAME / "config.pbtxt").read_text()
    assert 'name: "tensorrt_llm"' in pbtxt and 'backend: "python"' in pbtxt
    assert tuple(_names(pbtxt, "input")) == protocol.INPUT_NAMES
    assert tuple(_names(pbtxt, "output")) == protocol.OUTPUT_NAMES


def test_fill_inside_deployment_is_relative(tmp_path):
    repo = fill_triton(tmp_path, MANIFEST)
    assert repo == tmp_path / "triton"
    model = repo / MODEL_NAME
    assert sorted(p.relative_to(model).as_posix() for p in model.rglob("*") if p.is_file()) == [
        "1/model.py", "1/model.yaml", "config.pbtxt"]
    for path in model.rglob("*"):
        if path.is_file():
            assert "${" not in path.read_text()
    cfg = yaml.safe_load((model / "1" / "model.yaml").read_text())
    # relative to 1/, so dflash-build's temp dir can be renamed and the directory moved or mounted
    assert cfg["deployment_dir"] == "../../.."
    assert (model / "1" / cfg["deployment_dir"]).resolve() == tmp_path.resolve()
    assert cfg["triton_config"] == {"max_batch_size": 0, "decoupled": True, "cancellation_check_period_ms": 100}


def test_fill_elsewhere_is_absolute_and_refills(tmp_path):
    deployment = tmp_path / "dir with space"
    deployment.mkdir()
    repo = fill_triton(deployment, MANIFEST, decoupled_mode=False, repo_dir=tmp_path / "throwaway")
    cfg = yaml.safe_load((repo / MODEL_NAME / "1" / "model.yaml").read_text())
    assert cfg["deployment_dir"] == str(deployment.resolve())
    assert cfg["triton_config"]["decoupled"] is False
    fill_triton(deployment, MANIFEST, decoupled_mode=True, repo_dir=tmp_path / "throwaway")   # replaces it
    assert yaml.safe_load((repo / MODEL_NAME / "1" / "model.yaml").read_text())["triton_config"]["decoupled"]
    assert [p.name for p in repo.iterdir()] == [MODEL_NAME]


def test_fill_template_rules():
    assert fill_template("a ${x} b", {"x": "1"}) == "a 1 b"
    with pytest.raises(DFlashError, match=r"unfilled: \$\{y\}"):
        fill_template("${x} ${y}", {"x": "1"})


@pytest.mark.parametrize("manifest, field", [({"backend": "vllm"}, "manifest.backend"),
                                              ({"backend": "torch", "tp_size": 0}, "manifest.tp_size")])
def test_fill_rejects_bad_manifest(tmp_path, manifest, field):
    with pytest.raises(DFlashError, match=field):
        fill_triton(tmp_path, manifest)
    assert not (tmp_path / "triton" / MODEL_NAME).exists()
