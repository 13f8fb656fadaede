# SPDX-License-Identifier: Apache-2.0
"""dflash-generate --mode both: both modes warmed up, then alternated over rounds, one DFlash/AR figure."""
from __future__ import annotations

import json

import pytest

from trtllm_dflash import generate


@pytest.fixture(scope="module")
def pair(tmp_path_factory, smollm2_dir):
    from trtllm_dflash.testing import write_tiny_pair_with_tokenizer

    return write_tiny_pair_with_tokenizer(tmp_path_factory.mktemp("gen"), smollm2_dir)


def test_both_modes_alternate_over_rounds_and_print_one_ratio(pair, tmp_path, capsys, monkeypatch):
    target, drafter = pair
    calls = []
    from trtllm_dflash.runtime.engine import Engine

    orig = Engine.generate

    def spy(self, prompts, params=None):
        calls.append((self.block_size, params.max_new_tokens))
        return orig(self, prompts, params)

    monkeypatch.setattr(Engine, "generate", spy)
    out = tmp_path / "gen.json"
    rc = generate.main(["--target", str(target), "--drafter", str(drafter), "--mode", "both", "--rounds", "3",
                        "--draft_policy", "fixed", "--max_new_tokens", "12", "--max_seq_len", "256",
                        "--prompt", "Hello", "--prompt", "def f(x):", "--json", str(out)])
    assert rc == 0
    stdout, stderr = capsys.readouterr()
    # one whole warm-up generation per engine, then AR/DFlash, DFlash/AR, AR/DFlash
    blocks = [b for b, _ in calls]
    assert blocks[:2] == [1, 8] and blocks[2:] == [1, 8, 8, 1, 1, 8] and all(n == 12 for _, n in calls)
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("summary:")]
    assert "DFlash/AR speed-up" in line and "over 3 rounds" in line and line.count("x") >= 2
    assert "decode speed" not in line                  # one figure, not two that may disagree
    assert stdout.count("DFlash tokens identical to autoregressive: yes") == 2
    res = json.loads(out.read_text())
    assert len(res["rounds"]["speedup"]) == 3 and res["ar"][0]["output_ids"] == res["dflash"][0]["output_ids"]
    assert "(fixed: --draft_policy fixed)" in stderr


def test_a_mistyped_target_suggests_the_short_name(capsys):
    from trtllm_dflash import cli

    assert cli.generate_main(["--target", "smolm2-135m", "--mode", "ar"]) == 2
    assert "did you mean smollm2-135m?" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--deployment_dir", "--engine_dir", "--engine"])
def test_the_deployment_flag_and_its_old_names_open_it_once(tmp_path, flag, monkeypatch):
    from trtllm_dflash.deployment import Deployment

    Deployment.write(tmp_path, {"backend": "torch", "runtime": {"draft_policy": "adaptive"}})
    opened = []
    real = Deployment.open.__func__
    monkeypatch.setattr(Deployment, "open", classmethod(lambda cls, path: opened.append(path) or real(cls, path)))
    args = generate.parse_args([flag, str(tmp_path)])
    assert args.deployment.path == tmp_path and generate._policy(args) == "adaptive" and opened == [str(tmp_path)]


def test_a_directory_that_is_no_deployment_is_one_line(tmp_path):
    from trtllm_dflash.errors import DFlashError

    with pytest.raises(DFlashError, match=r"has no manifest\.json"):
        generate.parse_args(["--deployment_dir", str(tmp_path)])
