# SPDX-License-Identifier: Apache-2.0
"""gpt_oss_step --compare flashinfer on the CPU: a missing library is a one-line error before anything is built,
and the layout handed to FlashInfer (rows [up; gate], zero padding to 128) computes our experts under FlashInfer's
documented fused-MoE math (fc1's first half linear, second half gate; SwiGLU with alpha, beta 1 and the clamp)."""
from __future__ import annotations

import sys

import pytest
import torch

from tests.runtime.compare import clamping_tiny_experts
from trtllm_dflash.bench import flashinfer_moe, gpt_oss_step
from trtllm_dflash.runtime.models import mxfp4
from trtllm_dflash.runtime.models.gpt_oss import SWIGLU_ALPHA


@pytest.fixture
def no_flashinfer(monkeypatch):
    for name in ("flashinfer", "flashinfer.fused_moe"):
        monkeypatch.setitem(sys.modules, name, None)   # import raises ImportError, installed or not


def test_missing_library_is_a_one_line_error(no_flashinfer):
    with pytest.raises(SystemExit) as err:
        flashinfer_moe.load()
    msg = str(err.value)
    assert msg.startswith("--compare flashinfer needs flashinfer-python") and "pip install flashinfer-python" in msg
    assert "\n" not in msg


def test_benchmark_stops_before_building_when_flashinfer_is_missing(no_flashinfer, monkeypatch):
    monkeypatch.setattr(gpt_oss_step, "build", lambda *a, **k: pytest.fail("built the model before the check"))
    with pytest.raises(SystemExit, match="^--compare flashinfer needs flashinfer-python"):
        gpt_oss_step.main(["--tiny", "--device", "cpu", "--compare", "flashinfer"])


def flashinfer_math(lay: dict, x, ids, weights, limit: float) -> torch.Tensor:
    """FlashInfer's CUTLASS fused MoE as its kernel source defines it, float64, on the logical layout."""
    E, rows, Ip = lay["w1"].shape[0], lay["w1"].shape[1], lay["Ip"]
    Hp = lay["Hp"]
    w1 = mxfp4.dequantize(lay["w1"].reshape(E, rows, Hp // 32, 16), lay["s1"], torch.float64)     # [E, Hp, 2Ip]
    w2 = mxfp4.dequantize(lay["w2"].reshape(E, Hp, Ip // 32, 16), lay["s2"], torch.float64)       # [E, Ip, Hp]
    xp = torch.nn.functional.pad(x.double(), (0, Hp - x.shape[1]))
    out = torch.zeros(x.shape[0], Hp, dtype=torch.float64)
    for t in range(x.shape[0]):
        for e, w in zip(ids[t].tolist(), weights[t].double().tolist()):
            h = xp[t] @ w1[e] + lay["b1"][e].double()
            linear, gate = h[:Ip].clamp(-limit, limit), h[Ip:].clamp(max=limit)
            act = gate * torch.sigmoid(SWIGLU_ALPHA * gate) * (linear + flashinfer_moe.SWIGLU_BETA)
            out[t] += w * (act @ w2[e] + lay["b2"][e].double())
    return out[:, :x.shape[1]]


def test_layout_under_flashinfer_math_is_our_experts():
    mx, x, ids, weights = clamping_tiny_experts()
    lay = flashinfer_moe.layout(mx)
    H, I = 64, 64
    assert (lay["Hp"], lay["Ip"]) == (128, 128)                   # tiny sizes are padded: the padding is tested
    assert lay["w1"].shape == (4, 256, 64) and lay["s1"].shape == (4, 256, 4) and lay["b1"].shape == (4, 256)
    assert lay["w2"].shape == (4, 128, 64) and lay["s2"].shape == (4, 128, 4) and lay["b2"].shape == (4, 128)
    ours = mx.dequantized(torch.float32)(x, ids, weights).double()
    theirs = flashinfer_math(lay, x, ids, weights, mx.limit)
    assert ((theirs - ours).norm() / ours.norm()).item() < 1e-5
    w1 = mxfp4.dequantize(lay["w1"].reshape(4, 256, 4, 16), lay["s1"], torch.float64)
    h = torch.nn.functional.pad(x.double(), (0, 64)) @ w1[0] + lay["b1"][0].double()
    assert (h[:, 128:] > mx.limit).any() and (h[:, :128].abs() > mx.limit).any()   # both clamps were exercised
    # the same math on the interleaved rows as they are (no [up; gate] split) is not our experts: the test can fail
    wrong = dict(lay, w1=flashinfer_moe._pad(mx.gate_up_proj_blocks.reshape(4, 2 * I, H // 2), 256, 64),
                 s1=flashinfer_moe._pad(mx.gate_up_proj_scales, 256, 4))
    assert ((flashinfer_math(wrong, x, ids, weights, mx.limit) - ours).norm() / ours.norm()).item() > 0.5


def test_library_present_but_no_hopper_stops_the_run(monkeypatch):
    fake = type(sys)("flashinfer")
    fake.fused_moe = type(sys)("flashinfer.fused_moe")
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.setitem(sys.modules, "flashinfer.fused_moe", fake.fused_moe)
    monkeypatch.setattr(gpt_oss_step, "build", lambda *a, **k: pytest.fail("built the model before the check"))
    with pytest.raises(SystemExit, match="^--compare flashinfer compares against the MXFP4 kernels: run it with --experts triton"):
        gpt_oss_step.main(["--tiny", "--device", "cpu", "--compare", "flashinfer"])
    with pytest.raises(ValueError, match=r"^--compare flashinfer: its MXFP4 x bf16 MoE runs on Hopper \(sm90\) only"):
        flashinfer_moe.check_device(torch.device("cpu"))


def test_a_layer_flashinfer_refuses_is_an_error_row_not_a_lost_run():
    from trtllm_dflash.bench.routing_trace import Routing
    target, _ = gpt_oss_step.build("gpt-oss-20b", True, torch.device("cpu"), torch.float32, 32, "triton")
    rows = gpt_oss_step.moe_layer_vs_library(target, "flashinfer", object(), [Routing()], [(1, 1)], 2, None)
    assert rows == [{"error": "setup: ValueError: --compare flashinfer: its MXFP4 x bf16 MoE runs on Hopper (sm90) "
                              "only, not on cpu (compute capability None); leave --compare off here"}]
