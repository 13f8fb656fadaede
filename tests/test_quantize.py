# SPDX-License-Identifier: Apache-2.0
"""dflash-build --quant on CPU: ModelOpt FP8 and NVFP4 of a tiny Llama target, what the manifest and YAML say,
the hardware refusal, calibration prompts, and the torch runtime running the quantized builds (dequantised on load).

Tests that quantize need NVIDIA ModelOpt (``pip install 'trtllm-dflash[modelopt]'``) and skip, saying so, only
when it cannot be imported.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from trtllm_dflash.testing import VOCAB, write_tiny_pair
from trtllm_dflash import build_config as bc
from trtllm_dflash import cli, quantize
from trtllm_dflash.checkpoints import hf, manifest
from trtllm_dflash.deployment import Deployment
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime import quant, shard


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def mtq():
    """modelopt.torch.quantization, or a skip naming the extra (the only reason these tests skip)."""
    try:
        import modelopt.torch.quantization as mtq
    except ImportError as err:
        pytest.skip(f"NVIDIA ModelOpt is not importable ({err}): {quantize.INSTALL}")
    return mtq


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("quant_pair"), "llama")


def run(argv, capsys):
    capsys.readouterr()
    rc = cli.build_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def quant_args(pair, out, *extra):
    target, drafter = pair
    # the tiny target has no tokenizer, so it calibrates on seeded random token ids
    return ["--target", target, "--drafter", drafter, "--max_seq_len", 512, "--out", out,
            "--calib_data", "random", "--calib_size", 4, *extra]


@pytest.fixture(scope="module")
def builds(mtq, pair, tmp_path_factory):
    """{"fp8": dir, "nvfp4": dir}: torch-backend deployments checked for h100 (FP8) and b200 (NVFP4), built on CPU."""
    root = tmp_path_factory.mktemp("quant_builds")
    flags = {"fp8": ["--quant", "fp8"], "nvfp4": ["--quant", "nvfp4", "--gpu", "b200"]}
    out = {}
    for algo, extra in flags.items():
        out[algo] = root / algo
        assert cli.build_main([str(a) for a in quant_args(pair, out[algo], *extra)]) == 0
    return out


# ---- checks that need no ModelOpt -------------------------------------------------------------------------
def test_nvfp4_on_hopper_is_refused_with_one_line(pair, tmp_path, capsys):
    out = tmp_path / "deploy"
    rc, _, err = run(quant_args(pair, out, "--quant", "nvfp4", "--gpu", "h100"), capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: quant: ")
    assert "NVFP4" in err and "Blackwell" in err and "--quant fp8" in err
    assert not out.exists() and not list(tmp_path.glob(".deploy.*"))


def test_dry_run_plans_the_quant_and_needs_no_modelopt(pair, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "modelopt", None)   # import modelopt -> ImportError
    rc, stdout, _ = run(quant_args(pair, tmp_path / "d", "--quant", "nvfp4", "--gpu", "b200", "--backend", "trtllm",
                                   "--dry_run"), capsys)
    assert rc == 0 and "quant    nvfp4: ModelOpt PTQ" in stdout
    assert "# Quantization: NVFP4 (ModelOpt), read by TensorRT-LLM from <dir>/target/hf_quant_config.json" in stdout
    assert not (tmp_path / "d").exists()


def test_missing_modelopt_names_the_extra_and_writes_nothing(pair, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "modelopt", None)
    out = tmp_path / "deploy"
    rc, _, err = run(quant_args(pair, out, "--quant", "fp8"), capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "pip install 'trtllm-dflash[modelopt]'" in err
    assert not out.exists() and not list(tmp_path.glob(".deploy.*"))


@pytest.mark.parametrize("kw, field", [
    ({"quant": "int4"}, "quant"),
    ({"quant": "fp8", "calib_size": 0}, "calib_size"),
    ({"quant": "fp8", "calib_data": "wikitext"}, "calib_data"),
    ({"quant": "fp8", "calib_data": "/nonexistent/prompts.jsonl"}, "calib_data"),
])
def test_bad_quant_settings_name_the_field(kw, field):
    with pytest.raises(DFlashError) as err:
        bc.BuildConfig(target="qwen3-8b", **kw)
    assert err.value.field == field and "Fix:" in str(err.value)


def test_quant_none_is_the_unquantized_build():
    assert bc.BuildConfig(target="qwen3-8b", quant="none").quant is None


def _word_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer over w0..w95 with a tiny chat template, saved next to nothing else."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0")
    fast.chat_template = ("{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
                          "{% if add_generation_prompt %}w3{% endif %}")
    fast.save_pretrained(folder)
    return folder


def test_calibration_prompts_from_jsonl(tmp_path):
    folder = _word_tokenizer(tmp_path / "tok")
    calib = tmp_path / "calib.jsonl"
    calib.write_text('{"messages": [{"role": "user", "content": "w5 w6"}]}\n\n{"text": "w7 w8 w9"}\n'
                     '{"text": "w10"}\n')
    ids = quantize.calibration_ids(str(calib), 2, folder, vocab_size=VOCAB, max_len=4)
    assert ids == [[1, 5, 6, 2], [7, 8, 9]]   # chat-templated and cut to max_len; plain text as is; first 2 lines
    assert quantize.calibration_ids("random", 3, folder, vocab_size=VOCAB, max_len=8) == \
        quantize.calibration_ids("random", 3, folder, vocab_size=VOCAB, max_len=8)   # seeded
    calib.write_text('{"id": "a", "prompt": "w5 w6"}\n')   # dflash-train's prompt files work too
    assert quantize.calibration_ids(str(calib), 2, folder, vocab_size=VOCAB, max_len=4) == [[1, 5, 6, 2]]
    calib.write_text('{"prompt": ""}\n')
    with pytest.raises(DFlashError, match=r"calib\.jsonl:1"):
        quantize.calibration_ids(str(calib), 2, folder, vocab_size=VOCAB)
    with pytest.raises(DFlashError, match="no tokenizer"):
        quantize.calibration_ids("mtbench", 2, tmp_path, vocab_size=VOCAB)


def test_scales_are_replicated_and_nvfp4_block_scales_split_with_their_weight():
    scalar = torch.tensor(0.5)
    assert shard.slice_for_rank("model.layers.0.self_attn.q_proj.weight_scale", scalar, 2, 1) is scalar
    assert shard.slice_for_rank("model.layers.0.mlp.down_proj.input_scale", scalar, 2, 1) is scalar
    block = torch.arange(8 * 4).view(8, 4)   # down_proj [out 8, in 64] -> block scales [8, 64 / 16]
    assert torch.equal(shard.slice_for_rank("model.layers.0.mlp.down_proj.weight_scale", block, 2, 1), block[:, 2:])
    assert torch.equal(shard.slice_for_rank("model.layers.0.mlp.up_proj.weight_scale", block, 2, 1), block[4:])


# ---- ModelOpt itself ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["fp8", "nvfp4"])
def test_dequantize_matches_modelopt(mtq, tmp_path, algo):
    """Our dequantisation of the exported tensors equals ModelOpt's own, and stays within the format's error."""
    import transformers
    from modelopt.torch.export import export_hf_checkpoint
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    from trtllm_dflash.testing import write_tiny_target

    src = write_tiny_target(tmp_path / "src", "llama", num_layers=1)
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    mtq.quantize(model, getattr(mtq, quantize.RECIPES[algo]), lambda m: m(torch.randint(0, VOCAB, (2, 16))))
    original = hf.load_state_dict(src)
    lin = model.model.layers[0].mlp.down_proj
    if algo == "fp8":   # ModelOpt's fake quantization of the weight (before the export packs it in place)
        with torch.no_grad():
            fake = lin.weight_quantizer(lin.weight.detach().clone())
    export_hf_checkpoint(model, export_dir=tmp_path / algo)
    exported = hf.load_state_dict(tmp_path / algo)
    got = quant.dequantize(exported, torch.float32)
    assert set(got) == set(original)   # every *_scale consumed, every weight back under its own name
    name = "model.layers.0.mlp.down_proj.weight"
    if algo == "fp8":
        want, bound = fake, 2.0 ** -4   # E4M3: 3 mantissa bits, round to nearest
    else:   # NVFP4 fake quantization runs on CUDA only; its packed-tensor dequantize runs anywhere
        w = exported[name]
        want = NVFP4QTensor(torch.Size((w.shape[0], w.shape[1] * 2)), torch.float32, w).dequantize(
            torch.float32, scale=exported[f"{name}_scale"], double_scale=exported[f"{name}_scale_2"],
            block_sizes={-1: 16})
        # half the top E2M1 step (4 -> 6) is 1/6 of a 16-value block's amax, plus the FP8 rounding of its scale
        bound = 0.18
    torch.testing.assert_close(got[name], want, rtol=1e-6, atol=1e-7)
    for n, t in original.items():
        if n.endswith("proj.weight"):
            err = (got[n] - t).abs()
            assert (err <= bound * t.abs().amax(dim=1, keepdim=True) + 1e-6).all(), n
        else:
            assert torch.equal(got[n], t), n   # norms and embeddings are not quantized


def test_fp8_and_nvfp4_builds_record_the_quantization(builds):
    for algo, out in builds.items():
        m = Deployment.open(out).manifest
        q = m["quant"]
        assert q["quant"] == algo and q["quant_algo"] == algo.upper() and q["modelopt"]
        assert q["calib_data"] == "random" and q["calib_size"] == 4 and q["calib_s"] > 0
        assert q["kv_cache_quant_algo"] is None and "lm_head" in q["exclude_modules"]
        assert q["group_size"] == (16 if algo == "nvfp4" else None)
        assert m["validation"]["quant"] == "ok" and m["target"]["linked"] is False
        hq = json.loads((out / "target" / "hf_quant_config.json").read_text())["quantization"]
        assert hq["quant_algo"] == algo.upper()
        cfg = json.loads((out / "target" / "config.json").read_text())
        assert cfg["quantization_config"]["quant_method"] == "modelopt"
        assert not any(p.is_symlink() for p in (out / "target").iterdir())
        assert not manifest.verify(out, m)
        text = (out / "llm_api_options.yaml").read_text()
        assert f"# Quantization: {algo.upper()} (ModelOpt)" in text
        assert "quant_config" not in yaml.safe_load(text)   # TensorRT-LLM reads target/hf_quant_config.json
    assert Deployment.open(builds["fp8"]).manifest["validation"]["quant on the torch backend"].startswith("warning")
    assert "quant   FP8 (ModelOpt" in manifest.summary(Deployment.open(builds["fp8"]).manifest)


def _plain_copy(quantized: Path, out: Path) -> Path:
    """The quantized target with its weights dequantised by hand and saved as a plain checkpoint."""
    out.mkdir()
    (out / "config.json").write_text((quantized / "config.json").read_text())
    hf.save_state_dict(quant.dequantize(hf.load_state_dict(quantized), torch.float32), out)
    return out


@pytest.mark.parametrize("algo", ["fp8", "nvfp4"])
def test_torch_backend_runs_the_quantized_build(builds, pair, tmp_path, algo):
    from trtllm_dflash.config import RuntimeConfig, SamplingParams
    from trtllm_dflash.runtime.engine import Engine

    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, VOCAB - 2, (int(n),), generator=gen).tolist()
               for n in torch.randint(3, 12, (16,), generator=gen)]
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    rt = RuntimeConfig(max_batch_size=len(prompts), max_seq_len=512)   # one wave: fewer steps on CPU

    def tokens(engine):
        out = [r.output_ids for r in engine.generate(prompts, params)]
        engine.shutdown()
        return out

    got = tokens(Engine.from_deployment(builds[algo], max_batch_size=len(prompts)))
    # loading through the runtime's hook is exactly the dequantised checkpoint
    plain = _plain_copy(builds[algo] / "target", tmp_path / "plain")
    assert got == tokens(Engine.from_dirs(plain, pair[1], rt))
    if algo == "fp8":   # and it stays close to the unquantized target (a tiny random model is chaotic)
        base = tokens(Engine.from_dirs(pair[0], pair[1], rt))
        first = sum(a[0] == b[0] for a, b in zip(got, base)) / len(got)
        prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(got, base)]
        # measured (modelopt 0.47, torch 2.13 CPU): first token 15/16, mean common prefix 3.4 of 16
        assert first >= 0.75 and sum(prefix) / len(prefix) >= 2.0, (first, prefix)


def test_presharded_fp8_ranks_dequantise_to_slices_of_the_whole(mtq, pair, tmp_path, capsys):
    """Per-tensor scales travel whole to every rank; each rank's dequantised slice is a slice of the whole."""
    from safetensors.torch import load_file

    out = tmp_path / "tp2"
    rc, _, err = run(quant_args(pair, out, "--quant", "fp8", "--tp", "2", "--presharded"), capsys)
    assert rc == 0, err
    whole = quant.dequantize(hf.load_state_dict(out / "target"), torch.float32)
    for rank in range(2):
        sd = load_file(str(out / "ranks" / f"rank{rank}.safetensors"))
        mine = quant.dequantize({k[len("target."):]: v for k, v in sd.items() if k.startswith("target.")},
                                torch.float32)
        for name in ("model.layers.1.self_attn.k_proj.weight", "model.layers.1.mlp.down_proj.weight"):
            assert torch.equal(mine[name], shard.slice_for_rank(name, whole[name], 2, rank)), name
