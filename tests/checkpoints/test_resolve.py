# SPDX-License-Identifier: Apache-2.0
"""Short names, local folders and hub ids; offline hub ids fail with a message that names the way out."""
from __future__ import annotations

import pytest

from trtllm_dflash.checkpoints import resolve
from trtllm_dflash.errors import DFlashError


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """An empty HF cache and HF_HUB_OFFLINE=1: nothing can be found or fetched."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)


def test_short_names_expand_to_target_and_drafter():
    assert resolve.expand_short_name("gpt-oss-120b", None) == ("openai/gpt-oss-120b", "z-lab/gpt-oss-120b-DFlash")
    assert resolve.expand_short_name("Qwen3-8B", None) == ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16")
    assert resolve.expand_short_name("smollm2-135m", None) == (resolve.PACKAGED_SMOLLM2, "smollm2-135m-dflash")
    assert resolve.expand_short_name("qwen3-8b", "/my/drafter")[1] == "/my/drafter"


def test_unknown_target_needs_a_drafter():
    with pytest.raises(DFlashError, match="no known DFlash drafter"):
        resolve.expand_short_name("org/some-model", None)


def test_every_short_name_has_public_configs_for_dry_runs():
    for name, known in resolve.KNOWN_MODELS.items():
        assert resolve.public_config(known.target)["architectures"], name
        if known.drafter in resolve.SHIPPED_DRAFTERS:   # on disk already: dry runs read its config.json
            assert resolve.resolve(known.drafter, role="drafter", download=False).path is not None, name
        elif known.drafter != resolve.UNTRAINED:
            cfg = resolve.public_config(known.drafter)
            assert cfg["dflash_config"]["target_layer_ids"] and cfg["block_size"] > 1, name
    cfg = resolve.public_config("openai/gpt-oss-120b")
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_local_experts"]) == (36, 2880, 128)
    cfg["hidden_size"] = 1                                  # callers get a copy
    assert resolve.public_config("openai/gpt-oss-120b")["hidden_size"] == 2880


def test_local_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    res = resolve.resolve(str(tmp_path), role="target")
    assert (res.kind, res.path, res.revision) == ("local", tmp_path.resolve(), None)


@pytest.mark.parametrize("spec, match", [("./does-not-exist", "not a directory"),
                                         ("not a hub id", "neither a local folder")])
def test_bad_specs(spec, match):
    with pytest.raises(DFlashError, match=match):
        resolve.resolve(spec, role="target")


def test_a_file_is_not_a_checkpoint(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(DFlashError, match="not a directory"):
        resolve.resolve(str(tmp_path / "f"), role="drafter")


def test_offline_hub_id_names_hf_hub_offline_and_local_folders(offline):
    with pytest.raises(DFlashError) as err:
        resolve.resolve("z-lab/gpt-oss-120b-DFlash", role="drafter")
    msg = str(err.value)
    assert msg.startswith("drafter: z-lab/gpt-oss-120b-DFlash") and "HF_HUB_OFFLINE" in msg
    assert "local folder" in msg and "\n" not in msg
    with pytest.raises(DFlashError, match="HF_HUB_OFFLINE"):
        resolve.fetch_config(resolve.Resolved("x/y", "x/y", "hub", None, None), "target")


def test_planning_never_downloads(offline):
    res = resolve.resolve("openai/gpt-oss-120b", role="target", download=False)
    assert (res.kind, res.path) == ("hub", None)


def test_cached_snapshot_pins_its_commit(offline, tmp_path):
    import huggingface_hub.constants as c

    commit = "a" * 40
    snap = tmp_path / "hf-cache" / "models--org--tiny" / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text(commit)
    assert c.HF_HUB_CACHE == str(tmp_path / "hf-cache")
    res = resolve.resolve("org/tiny", role="target")
    assert (res.kind, res.revision, res.path) == ("hub", commit, snap)
