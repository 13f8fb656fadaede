# SPDX-License-Identifier: Apache-2.0
"""runtime/fp8.py (fp8_gemm): per-token activation quantization, Fp8Linear against a float64 reference,
fused per-row scales, the per-layer fallback, the device refusal, and the loader keeping a ModelOpt FP8
target in FP8 (fused, tensor-parallel slices, per-channel scales).

torch._scaled_mm runs on CPU in torch 2.13 (row-wise scales, float32 or bfloat16 out), so the module itself is
checked here; the engine still refuses fp8_gemm off CUDA >= 8.9, where it would only be slower.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.runtime.compare import rel
from trtllm_dflash.testing import write_tiny_pair
from trtllm_dflash import cli
from trtllm_dflash.checkpoints import hf
from trtllm_dflash.model_config import target_config
from trtllm_dflash.config import RuntimeConfig
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime import fp8, quant, shard
from trtllm_dflash.runtime.distributed import TPGroup
from trtllm_dflash.runtime.weights import load_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = torch.device("cpu")
PROJ = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def fp8_weight(rows: int, cols: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random FP8 weight and its per-row scales, ModelOpt-style (amax / 448 per tensor, then per row)."""
    w = torch.randn(rows, cols, generator=gen) * 0.05
    scale = w.abs().amax() / fp8.FP8_MAX
    return (w / scale).to(fp8.FP8), quant.fp8_row_scales(scale, rows)


def layer(w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> fp8.Fp8Linear:
    lin = fp8.Fp8Linear(w.shape[1], w.shape[0], bias is not None)
    lin.weight.data, lin.weight_scale.data = w, scale
    if bias is not None:
        lin.bias.data = bias
    return lin


def emulate(x: torch.Tensor, lin: fp8.Fp8Linear) -> torch.Tensor:
    """What _scaled_mm computes, in float64: dequantised activations times dequantised weights."""
    xq, sx = fp8.quantize_rows(x.reshape(-1, lin.in_features))
    w = lin.weight.double() * lin.weight_scale.double()[:, None]
    out = (xq.double() * sx.double()) @ w.T + (lin.bias.double() if lin.bias is not None else 0)
    return out.view(*x.shape[:-1], -1)


# ---- the module --------------------------------------------------------------------------------------------
def test_quantize_rows_keeps_each_token_within_e4m3_rounding():
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(0)) * torch.tensor([1e-3, 1, 10, 100, 1, 1])[:, None]
    x[4] = 0.0   # an all-zero row: scale stays finite, values stay zero
    xq, scale = fp8.quantize_rows(x)
    assert xq.dtype == fp8.FP8 and scale.shape == (6, 1) and scale.dtype == torch.float32
    back = xq.float() * scale
    assert torch.isfinite(back).all() and torch.equal(back[4], x[4])
    assert torch.allclose(back.abs().amax(-1), x.abs().amax(-1), rtol=1e-6)   # each row's amax maps to 448
    # e4m3: 3 mantissa bits, round to nearest -> relative error <= 2^-4 (plus subnormals near zero)
    assert ((back - x).abs() <= 2.0 ** -4 * x.abs() + 2.0 ** -9 * scale).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_matches_the_float64_reference(dtype):
    gen = torch.Generator().manual_seed(1)
    w, scale = fp8_weight(48, 64, gen)
    lin = layer(w, scale, bias=torch.randn(48, generator=gen).to(dtype))
    x = torch.randn(2, 3, 64, generator=gen).to(dtype)
    y = lin(x)
    assert y.shape == (2, 3, 48) and y.dtype == dtype
    # the GEMM itself is the emulated one, up to the output dtype's rounding
    torch.testing.assert_close(y.double(), emulate(x, lin), rtol=1e-5 if dtype == torch.float32 else 2 ** -7,
                               atol=1e-5 if dtype == torch.float32 else 1e-2)
    # and against unquantized activations the error is the per-token e4m3 rounding, averaged over 64 inputs
    exact = x.double() @ (w.double() * scale.double()[:, None]).T + lin.bias.double()
    assert rel(y, exact) < 0.07


def test_fused_rows_equal_separate_per_tensor_linears():
    """q/k/v with three per-tensor scales, fused into one Fp8Linear with per-row scales: the same numbers."""
    gen = torch.Generator().manual_seed(2)
    parts = [fp8_weight(n, 64, gen) for n in (64, 32, 32)]
    fused = layer(torch.cat([w for w, _ in parts]), torch.cat([s for _, s in parts]))
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(5, 64, generator=gen).to(dtype)
        assert torch.equal(fused(x), torch.cat([layer(w, s)(x) for w, s in parts], -1))


def test_row_scales_from_every_modelopt_shape():
    assert torch.equal(quant.fp8_row_scales(torch.tensor(0.5), 3), torch.full((3,), 0.5))
    per_channel = torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(quant.fp8_row_scales(per_channel, 3), per_channel)
    assert torch.equal(quant.fp8_row_scales(per_channel[:, None], 3), per_channel)


def test_convert_falls_back_per_layer_and_says_why(capsys):
    gen = torch.Generator().manual_seed(3)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 48), nn.Linear(24, 32, bias=False), nn.Linear(64, 16))
    sd = {}
    for name, (rows, cols) in {"0": (48, 64), "1": (32, 24)}.items():
        sd[f"{name}.weight"], sd[f"{name}.weight_scale"] = fp8_weight(rows, cols, gen)
    sd["2.weight"] = torch.randn(16, 64)   # not quantized: stays an nn.Linear
    want = quant.dequantize_fp8(sd["1.weight"], sd["1.weight_scale"], torch.float32)
    assert fp8.convert(model, sd, CPU, torch.float32) == 1
    assert isinstance(model[0], fp8.Fp8Linear) and model[0].weight.is_meta
    assert type(model[1]) is nn.Linear and type(model[2]) is nn.Linear
    assert torch.equal(sd["1.weight"], want) and "1.weight_scale" not in sd
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fp8_gemm: 1 FP8 linears run dequantised" in err and ": 1" in err
    assert "multiple of 16" in err
    assert "bfloat16" in fp8.unsupported(64, 64, torch.device("cuda"), torch.float16)
    assert fp8.unsupported(64, 64, torch.device("cuda"), torch.bfloat16) is None


def test_fp8_gemm_off_cuda_is_refused_with_one_line():
    with pytest.raises(DFlashError) as err:
        fp8.check_device(CPU, torch.bfloat16)
    assert err.value.field == "fp8_gemm" and "\n" not in str(err.value)
    assert "compute capability >= 8.9" in str(err.value) and "Fix: leave fp8_gemm off" in str(err.value)


def test_fp8_gemm_on_a_plain_target_is_a_note_not_an_error(tiny_pair, capsys):
    """One setting can serve quantized and plain deployments alike; the plain one just runs as before."""
    model = load_target(tiny_pair[0], target_config(hf.read_config(tiny_pair[0])),
                        TPGroup(), CPU, torch.float32, 64, fp8_gemm=True)
    assert not any(isinstance(m, fp8.Fp8Linear) for m in model.modules())
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fp8_gemm" in err and "no FP8 linears" in err and "float32" in err


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs a CUDA GPU with compute capability >= 8.9")
def test_cuda_scaled_mm_matches_the_emulation_and_captures_in_a_graph():
    gen = torch.Generator().manual_seed(4)
    w, scale = fp8_weight(96, 128, gen)
    lin = layer(w, scale, bias=torch.randn(96, generator=gen).bfloat16()).cuda()
    x = torch.randn(7, 128, generator=gen).bfloat16().cuda()
    y = lin(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), emulate(x, lin), rtol=2 ** -7, atol=1e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):   # the engine replays decode steps as graphs: no host sync inside
        out = lin(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, y)


# ---- a ModelOpt FP8 build of the tiny target ------------------------------------------------------------
@pytest.fixture(scope="module")
def fp8_build(tmp_path_factory):
    """The deployment dflash-build --quant fp8 writes (skips only when ModelOpt cannot be imported)."""
    try:
        import modelopt.torch.quantization  # noqa: F401
    except ImportError as err:
        pytest.skip(f"NVIDIA ModelOpt is not importable ({err})")
    root = tmp_path_factory.mktemp("fp8_gemm")
    target, drafter = write_tiny_pair(root / "pair", "llama")
    out = root / "fp8"
    argv = ["--target", target, "--drafter", drafter, "--max_seq_len", 512, "--out", out, "--calib_data", "random",
            "--calib_size", 4, "--quant", "fp8"]
    assert cli.build_main([str(a) for a in argv]) == 0
    return out


def test_engine_refuses_fp8_gemm_on_cpu_and_loads_as_before_without_it(fp8_build):
    from trtllm_dflash.config import SamplingParams
    from trtllm_dflash.runtime.engine import Engine

    with pytest.raises(DFlashError) as err:
        Engine.from_deployment(fp8_build, fp8_gemm=True)
    assert err.value.field == "fp8_gemm" and "\n" not in str(err.value)
    engine = Engine.from_deployment(fp8_build, fp8_gemm=False)
    assert not any(isinstance(m, fp8.Fp8Linear) for m in engine.target.modules())
    out = engine.generate([[3, 4, 5]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    engine.shutdown()
    assert len(out[0].output_ids) == 4


def _dequantised(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each projection's weight as the value it stands for (float64)."""
    out = {}
    for name, m in model.named_modules():
        if name.endswith(PROJ):
            w = m.weight.double()
            out[name] = w * m.weight_scale.double()[:, None] if isinstance(m, fp8.Fp8Linear) else w
    return out


def test_loader_keeps_fp8_weights_fused_with_their_row_scales(fp8_build):
    target = fp8_build / "target"
    plain = load_target(target, target_config(hf.read_config(target)), TPGroup(), CPU, torch.float32, 64)
    ours = load_target(target, target_config(hf.read_config(target)), TPGroup(), CPU, torch.float32, 64, fp8_gemm=True)
    raw = hf.load_state_dict(target)
    qkv = ours.layers[1].self_attn.qkv_proj
    assert isinstance(qkv, fp8.Fp8Linear) and qkv.weight.dtype == fp8.FP8 and qkv.weight_scale.dtype == torch.float32
    src = [f"model.layers.1.self_attn.{p}_proj.weight" for p in "qkv"]
    assert torch.equal(qkv.weight.view(torch.uint8), torch.cat([raw[n] for n in src]).view(torch.uint8))
    assert torch.equal(qkv.weight_scale, torch.cat([raw[f"{n}_scale"].expand(raw[n].shape[0]) for n in src]))
    assert ours.embed_tokens.weight.dtype == torch.float32 and type(ours.lm_head) is nn.Linear   # not quantized
    want, got = _dequantised(plain), _dequantised(ours)
    assert len(got) == 4 * len(ours.layers)
    for name in want:   # both round the same product (weight x scale) once to float32
        assert torch.equal(got[name].float(), want[name].float()), name
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    for i, block in enumerate(ours.layers):   # each FP8 GEMM within its activation rounding of the plain one
        assert rel(block.mlp.gate_up_proj(x), plain.layers[i].mlp.gate_up_proj(x)) < 0.07


def _per_channel_copy(target: Path, out: Path) -> Path:
    """The FP8 target with per-output-channel weight scales: [out] on column-parallel weights, [out, 1] on
    row-parallel ones (the two shapes ModelOpt writes), so tensor-parallel slicing must move them with rows."""
    sd = hf.load_state_dict(target)
    for name in [n for n in sd if n.endswith(".weight_scale")]:
        rows = sd[name.removesuffix("_scale")].shape[0]
        scales = sd[name] * torch.linspace(0.5, 1.5, rows)
        sd[name] = scales[:, None] if shard.shard_dim(name) == 1 else scales
    out.mkdir()
    for f in ("config.json", "hf_quant_config.json"):
        (out / f).write_text((target / f).read_text())
    hf.save_state_dict(sd, out)
    return out


def test_tensor_parallel_slices_carry_their_scales(fp8_build, tmp_path):
    """tp 2 from the whole checkpoint (lazy safetensors slices): each rank's FP8 weights stand for exactly the
    rank's slice of the dequantised whole, with per-tensor and per-channel scales."""
    per_tensor = fp8_build / "target"
    for target in (per_tensor, _per_channel_copy(per_tensor, tmp_path / "per_channel")):
        whole = quant.dequantize(hf.load_state_dict(target), torch.float64)
        for rank in range(2):
            got = _dequantised(load_target(target, target_config(hf.read_config(target)),
                                           TPGroup(rank, 2), CPU, torch.float32, 64,
                                           fp8_gemm=True))

            def part(name: str) -> torch.Tensor:
                return shard.slice_for_rank(name, whole[name], 2, rank)

            for i in range(4):
                src, dst = f"model.layers.{i}.", f"layers.{i}."
                want = {
                    f"{dst}self_attn.qkv_proj": torch.cat([part(f"{src}self_attn.{x}_proj.weight") for x in "qkv"]),
                    f"{dst}self_attn.o_proj": part(f"{src}self_attn.o_proj.weight"),
                    f"{dst}mlp.gate_up_proj": torch.cat([part(f"{src}mlp.{x}_proj.weight") for x in ("gate", "up")]),
                    f"{dst}mlp.down_proj": part(f"{src}mlp.down_proj.weight")}
                for name, w in want.items():
                    torch.testing.assert_close(got[name], w, rtol=1e-7, atol=0, msg=f"{target.name} rank {rank} {name}")


def test_fp8_gemm_auto_is_on_only_where_it_runs(tiny_pair, capsys):
    """The default (None) follows the measurement: on for CUDA >= 8.9 in bfloat16, quietly off elsewhere."""
    assert RuntimeConfig().fp8_gemm is None
    assert fp8.effective(None, CPU, torch.bfloat16) is False and fp8.effective(False, CPU, torch.bfloat16) is False
    model = load_target(tiny_pair[0], target_config(hf.read_config(tiny_pair[0])),
                        TPGroup(), CPU, torch.float32, 64, fp8_gemm=None)
    assert not any(isinstance(m, fp8.Fp8Linear) for m in model.modules()) and capsys.readouterr().err == ""
    if torch.cuda.is_available():
        want = torch.cuda.get_device_capability() >= (8, 9)
        assert fp8.effective(None, torch.device("cuda"), torch.bfloat16) is want
        assert fp8.effective(None, torch.device("cuda"), torch.float32) is False
