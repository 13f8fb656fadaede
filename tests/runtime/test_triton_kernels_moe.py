# SPDX-License-Identifier: Apache-2.0
"""runtime/triton_kernels_moe.py and mxfp4_moe='triton_kernels' on the CPU: a missing library is a one-line error
(before the benchmark builds anything); the bytes handed to matmul_ogs (W as [E, K, N], MXFP4 along K, columns the
interleaved gate/linear pairs) compute our experts under matmul_ogs's documented math (gather, x @ W + bias, SwiGLU
on adjacent column pairs with alpha, the clamp and +1, then x @ W + bias, times the router weight, scatter-add);
the routing mask has one bit per (token, expert); TritonKernelsExperts sends one-token steps to our kernels and
longer ones to the library copy that after_load makes. The library's own kernels run on the GPU only
(tests/runtime/test_mxfp4_moe.py's gpu tests)."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import types

import pytest
import torch

from tests.runtime.compare import clamping_tiny_experts
from trtllm_dflash.bench import gpt_oss_step
from trtllm_dflash.bench.routing_trace import Routing
from trtllm_dflash.config import RuntimeConfig
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime import triton_kernels_moe
from trtllm_dflash.runtime.models import gpt_oss, mxfp4
from trtllm_dflash.runtime.kernels import TORCH
from trtllm_dflash.runtime.models.gpt_oss import SWIGLU_ALPHA

if not torch.cuda.is_available():
    # before the kernels are imported: triton.jit picks the interpreter when it decorates them
    os.environ["TRITON_INTERPRET"] = "1"

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.fixture
def no_triton_kernels(monkeypatch):
    for name in ("triton_kernels", "triton_kernels.swiglu"):
        monkeypatch.setitem(sys.modules, name, None)   # import raises ImportError, installed or not


def test_missing_library_is_a_one_line_error(no_triton_kernels):
    with pytest.raises(DFlashError) as err:
        triton_kernels_moe.load()
    msg = str(err.value)
    assert msg.startswith("mxfp4_moe: 'triton_kernels' needs the triton_kernels package") and "vllm/third_party" in msg
    assert "\n" not in msg


def test_benchmark_stops_before_building_when_the_library_is_missing(no_triton_kernels, monkeypatch):
    monkeypatch.setattr(gpt_oss_step, "build", lambda *a, **k: pytest.fail("built the model before the check"))
    with pytest.raises(SystemExit, match="^--compare triton_kernels: 'triton_kernels' needs the triton_kernels"):
        gpt_oss_step.main(["--tiny", "--device", "cpu", "--compare", "triton_kernels"])


def decode_k_major(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """MXFP4 packed along dim 1 (two K values per byte, low nibble first; one E8M0 scale per 32 K values):
    w [E, K/2, N] uint8, s [E, K/32, N] uint8 -> [E, K, N] float64. Written from the OCP MX format, not ours."""
    table = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64)
    nibbles = torch.stack([w & 0xF, w >> 4], 2).flatten(1, 2).long()            # [E, K, N]
    scale = torch.pow(2.0, s.double() - 127).repeat_interleave(32, 1)            # [E, K, N]
    return table[nibbles] * scale


def matmul_ogs_math(lay: dict, x, ids, weights, limit: float, swap_pairs: bool = False) -> torch.Tensor:
    """Two matmul_ogs calls as the library defines them, float64, on the logical layout."""
    w1, w2 = decode_k_major(lay["w1"], lay["s1"]), decode_k_major(lay["w2"], lay["s2"])   # [E, H, 2I], [E, I, H]
    out = torch.zeros(x.shape[0], lay["H"], dtype=torch.float64)
    for t in range(x.shape[0]):
        for e, w in zip(ids[t].tolist(), weights[t].double().tolist()):
            h = x[t].double() @ w1[e] + lay["b1"][e].double()
            gate, linear = (h[1::2], h[0::2]) if swap_pairs else (h[0::2], h[1::2])
            gate, linear = gate.clamp(max=limit), linear.clamp(-limit, limit)
            act = gate * torch.sigmoid(SWIGLU_ALPHA * gate) * (linear + 1)
            out[t] += w * (act @ w2[e] + lay["b2"][e].double())
    return out


def test_layout_under_matmul_ogs_math_is_our_experts():
    mx, x, ids, weights = clamping_tiny_experts()
    lay = triton_kernels_moe.layout(mx)
    H = I = 64
    assert lay["w1"].shape == (4, H // 2, 2 * I) and lay["s1"].shape == (4, H // 32, 2 * I)
    assert lay["w2"].shape == (4, I // 2, H) and lay["s2"].shape == (4, I // 32, H)
    assert lay["b1"].dtype == lay["b2"].dtype == torch.float32
    ours = mx.dequantized(torch.float32)(x, ids, weights).double()
    theirs = matmul_ogs_math(lay, x, ids, weights, mx.limit)
    assert ((theirs - ours).norm() / ours.norm()).item() < 1e-5
    h = x.double() @ decode_k_major(lay["w1"], lay["s1"])[0] + lay["b1"][0].double()
    assert (h[:, 0::2] > mx.limit).any() and (h[:, 1::2].abs() > mx.limit).any()   # both clamps were exercised
    # the pairs read the other way round are not our experts: the test can fail
    wrong = matmul_ogs_math(lay, x, ids, weights, mx.limit, swap_pairs=True)
    assert ((wrong - ours).norm() / ours.norm()).item() > 0.5


def test_an_intermediate_size_off_the_library_multiple_is_padded_with_zero_pairs():
    """A TP-2 rank of gpt-oss holds intermediate 1440, not a multiple of 64: the layout appends zero gate/linear
    pairs and zero down rows (here 96 -> 128), which contribute nothing: still our experts, within float64 noise."""
    from tests.runtime.test_mxfp4_moe import reference
    E, H, I = 4, 64, 96
    ex, w = experts_on(torch.device("cpu"), E, H, I)
    lay = triton_kernels_moe.layout(ex)
    assert lay["Ip"] == 128 and lay["w1"].shape == (E, H // 2, 256) and lay["w2"].shape == (E, 64, H)
    assert lay["s1"].shape == (E, H // 32, 256) and lay["s2"].shape == (E, 4, H) and lay["b1"].shape == (E, 256)
    # the library takes the packed axis to be the stride-1 one: padding must not move it off K
    assert lay["w1"].stride(1) == 1 and lay["w2"].stride(1) == 1
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(5)])
    weights = torch.softmax(torch.randn(5, 2, generator=g), -1)
    theirs = matmul_ogs_math(lay, x, ids, weights, ex.limit)
    ours = reference(x, ids, weights, w, 0)
    assert ((theirs - ours).norm() / ours.norm()).item() < 1e-12
    assert triton_kernels_moe.layout(experts_on(torch.device("cpu"), E, H, 128)[0])["w1"]._base is not None   # a view


def mask_words(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The packed routing mask in torch: [N, k] distinct ids -> [N, ceil(E/32)] int32, bit e % 32 of word e // 32."""
    words = torch.zeros(ids.shape[0], -(-num_experts // 32), dtype=torch.int64)
    ids = ids.long()
    words.scatter_add_(1, ids // 32, torch.ones_like(ids) << (ids % 32))
    return words.to(torch.int32)     # bit 31 wraps to the sign bit: the same 32 bits


@pytest.mark.parametrize("E", [128, 32, 40])
def test_routing_pack_kernel_sets_one_bit_per_token_expert(E):
    """runtime/kernels/moe_routing.py in Triton's interpreter: the mask words against a bit-by-bit reading, the
    int16 ids and cast weights, and the zeroed histogram buffer (E = 40: a partial last word)."""
    from trtllm_dflash.runtime.kernels import moe_routing
    g = torch.Generator().manual_seed(E)
    k, n = 4, 6
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(n)])
    ids[0] = torch.tensor([0, 31, 1, E - 1 if E > 32 else 2])      # bit 31: the sign bit of a word
    # float32 weights that bf16 holds exactly: the cast is checked, not the interpreter's rounding (it truncates)
    weights = torch.softmax(torch.randn(n, k, generator=g), -1).bfloat16().float()
    words, ids16, w, sums = moe_routing.pack_routing(ids, weights, E, torch.bfloat16, sums=64)
    assert torch.equal(words, mask_words(ids, E)) and words.dtype == torch.int32
    bits = words.view(torch.uint8).reshape(n, -1, 4)               # little-endian bytes of each word
    got = [[wd * 32 + b for wd in range(words.shape[1]) for b in range(32) if (int(bits[r, wd, b // 8]) >> (b % 8)) & 1]
           for r in range(n)]
    assert got == [sorted(row) for row in ids.tolist()]
    assert ids16.dtype == torch.int16 and torch.equal(ids16.long(), ids)
    assert w.dtype == torch.bfloat16 and torch.equal(w, weights.bfloat16())
    assert torch.equal(sums, torch.zeros(64, dtype=torch.int32))


def test_no_hopper_stops_the_run_and_a_refused_layer_is_an_error_row(monkeypatch):
    monkeypatch.setattr(triton_kernels_moe, "load", lambda field: {})
    monkeypatch.setattr(gpt_oss_step, "build", lambda *a, **k: pytest.fail("built the model before the check"))
    with pytest.raises(SystemExit, match="^--compare triton_kernels compares against the MXFP4 kernels"):
        gpt_oss_step.main(["--tiny", "--device", "cpu", "--compare", "triton_kernels"])
    with pytest.raises(DFlashError, match=r"^mxfp4_moe: 'triton_kernels' needs a Hopper or later GPU \(sm90\+\)"):
        triton_kernels_moe.check_device(torch.device("cpu"))
    monkeypatch.undo()
    target, _ = gpt_oss_step.build("gpt-oss-20b", True, torch.device("cpu"), torch.float32, 32, "triton")
    rows = gpt_oss_step.moe_layer_vs_library(target, "triton_kernels", {}, [Routing()], [(1, 1)], 2, None)
    assert rows == [{"error": "setup: DFlashError: --compare triton_kernels: 'triton_kernels' needs a Hopper or later "
                              "GPU (sm90+), not cpu (compute capability None). Fix: run it on an H100/H200/B200, or "
                              "use mxfp4_moe='triton'"}]


def test_the_setting_is_checked_like_the_other_mxfp4_kernels():
    assert RuntimeConfig(mxfp4_moe="triton_kernels").mxfp4_moe == "triton_kernels"
    with pytest.raises(DFlashError, match="use auto, triton, triton_kernels or dequant"):
        RuntimeConfig(mxfp4_moe="tk")
    assert mxfp4.resolve_kernel("triton_kernels", True, torch.device("cuda")) == "triton_kernels"
    with pytest.raises(DFlashError, match="^mxfp4_moe: 'triton_kernels' runs on CUDA GPUs only"):
        mxfp4.resolve_kernel("triton_kernels", True, torch.device("cpu"))
    with pytest.raises(DFlashError, match="^mxfp4_moe: 'triton_kernels' needs a checkpoint with MXFP4 experts"):
        mxfp4.resolve_kernel("triton_kernels", False, torch.device("cuda"))
    with pytest.raises(DFlashError, match="not batch invariant"):
        gpt_oss_step.build("gpt-oss-20b", True, torch.device("cpu"), torch.float32, 32, "triton_kernels",
                           kernels=dataclasses.replace(TORCH, batch_invariant=True))


def test_one_token_runs_ours_longer_steps_the_library_copy_after_load_makes(monkeypatch):
    made = []

    class FakeLibrary:
        def __init__(self, experts):
            made.append(experts)

        def __call__(self, x, ids, w):
            return torch.full_like(x, 2.0)

    monkeypatch.setattr(triton_kernels_moe, "MatmulOgsExperts", FakeLibrary)
    monkeypatch.setattr(gpt_oss.Mxfp4Experts, "forward", lambda self, x, ids, w: torch.full_like(x, 1.0))
    target, _ = gpt_oss_step.build("gpt-oss-20b", True, torch.device("cpu"), torch.float32, 32, "triton_kernels")
    layers = [layer.mlp.experts for layer in target.layers]
    assert made == layers and all(isinstance(e, gpt_oss.TritonKernelsExperts) for e in layers)   # build -> after_load
    ex = layers[0]
    ids, w = torch.tensor([[0, 1]] * 3), torch.full((3, 2), 0.5)
    assert ex(torch.zeros(1, 64), ids[:1], w[:1]).unique().tolist() == [1.0]      # one token: our kernels
    assert ex(torch.zeros(3, 64), ids, w).unique().tolist() == [2.0]              # 2+ tokens: the library
    ex.library = None
    with pytest.raises(DFlashError, match="ran before their library copy was made"):
        ex(torch.zeros(3, 64), ids, w)


def test_whole_experts_per_rank_only(monkeypatch):
    monkeypatch.setattr(triton_kernels_moe, "check_device", lambda dev, field: None)
    target, _ = gpt_oss_step.build("gpt-oss-20b", True, torch.device("cpu"), torch.float32, 32, "triton")
    ex = target.layers[0].mlp.experts
    monkeypatch.setattr(ex, "num_local", ex.num_experts // 2)
    with pytest.raises(DFlashError, match=r"runs whole experts on each rank; this rank holds 2 of 4 \(ep_size > 1\)"):
        triton_kernels_moe.MatmulOgsExperts(ex, tk={})


# ---- GPU (``gpu`` marker, triton_kernels importable): the library's kernels against float64 ------------------
needs_library = pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("triton_kernels") is None,
                                   reason="needs a CUDA GPU and triton_kernels (scripts/triton_kernels_wheel.sh)")


def experts_on_gpu(E, H, I, moe_rank=0, seed=0):
    return experts_on(torch.device("cuda"), E, H, I, moe_rank, seed)


def experts_on(device, E, H, I, moe_rank=0, seed=0):
    """An Mxfp4Experts-shaped object holding random_experts' tensors (what MatmulOgsExperts reads)."""
    from tests.runtime.test_mxfp4_moe import LIMIT, random_experts
    w = random_experts(E, H, I, device, seed)
    ex = types.SimpleNamespace(num_local=E, num_experts=E, inter=I, moe_rank=moe_rank, limit=LIMIT,
                               gate_up_proj_blocks=w["gu_blocks"], gate_up_proj_scales=w["gu_scales"],
                               gate_up_proj_bias=w["gu_bias"], down_proj_blocks=w["dn_blocks"],
                               down_proj_scales=w["dn_scales"], down_proj_bias=w["dn_bias"])
    return ex, w


@pytest.mark.gpu
@needs_library
@pytest.mark.parametrize("N", [1, 2, 10, 64, 300])
@pytest.mark.parametrize("shape", ["gpt-oss-20b", "tp2_rank1", "tiny_engine"])
def test_library_matches_float64(N, shape):
    """gpt-oss-20b's experts (32 x 2880 x 2880), a TP 2 rank that is not moe rank 0 (intermediate 1440, padded
    to 1472; no down bias), and the engine test's tiny model (4 experts, top-2, hidden 256, intermediate 128):
    within 1e-2 of the float64 reference, as our kernels are (test_mxfp4_moe.py)."""
    from tests.runtime.compare import rel
    from tests.runtime.test_mxfp4_moe import reference, routing
    E, H, I, rank, k = {"gpt-oss-20b": (32, 2880, 2880, 0, 4), "tp2_rank1": (32, 2880, 1440, 1, 4),
                        "tiny_engine": (4, 256, 128, 0, 2)}[shape]
    ex, w = experts_on_gpu(E, H, I, rank, seed=N)
    lib = triton_kernels_moe.MatmulOgsExperts(ex)
    ids, weights = routing(N, k, E, torch.device("cuda"), seed=N + 1)
    x = torch.randn(N, H, device="cuda").bfloat16()
    got = lib(x, ids, weights)
    want_w = w if rank == 0 else {**w, "dn_bias": torch.zeros_like(w["dn_bias"])}
    assert got.shape == (N, H) and got.dtype == torch.bfloat16
    assert rel(got, reference(x, ids, weights, want_w, 0)) < 1e-2


@pytest.mark.gpu
@needs_library
def test_library_under_cuda_graph_replays_new_routing():
    from tests.runtime.compare import rel
    from tests.runtime.test_mxfp4_moe import reference, routing
    E, H, I, N, dev = 16, 2880, 2880, 10, torch.device("cuda")
    ex, w = experts_on_gpu(E, H, I)
    lib = triton_kernels_moe.MatmulOgsExperts(ex)
    ids, weights = routing(N, 4, E, dev, 1)
    x = torch.randn(N, H, device=dev).bfloat16()
    lib(x, ids, weights)   # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = lib(x, ids, weights)
    for seed in (2, 3):   # new routing and activations in the same buffers: the graph must follow them
        new_ids, new_w = routing(N, 4, E, dev, seed)
        ids.copy_(new_ids), weights.copy_(new_w), x.normal_()
        graph.replay()
        assert rel(out, reference(x, ids, weights, w, 0)) < 1e-2


@pytest.mark.gpu
@needs_library
def test_engine_serves_dflash_on_the_library(tmp_path):
    """A small random MXFP4 gpt-oss (hidden 256, intermediate 128: the library's Hopper kernels take 256-wide output
    tiles at 8 warps) served by the engine with mxfp4_moe='triton_kernels' in bf16: the engine makes the library copy
    at load, prefill and DFlash's verify blocks run on it, AR's single tokens on our kernels; AR and DFlash agree on
    the first token (both prefill on the library). Token-for-token equality in bf16 is the batch-invariant mode's
    promise, which this setting refuses: outside it the step's kernels (GEMM tiles, attention splits, the experts)
    round a row differently with the token count (measured on an H200: even with every expert step on the library,
    one prompt of three parted at its 10th token), so the library's accuracy is what the float64 tests pin."""
    from trtllm_dflash.config import RuntimeConfig, SamplingParams
    from trtllm_dflash.runtime.engine import Engine
    from trtllm_dflash.testing import VOCAB, write_gpt_oss_drafter, write_tiny_gpt_oss
    target = write_tiny_gpt_oss(tmp_path / "t", mxfp4=True, seed=1, hidden=256, intermediate=128)
    drafter = write_gpt_oss_drafter(target, tmp_path / "d")
    g = torch.Generator().manual_seed(0)
    ps = [torch.randint(2, VOCAB - 2, (n,), generator=g).tolist() for n in (3, 17, 30)]
    cfg = dict(max_seq_len=128, max_batch_size=2, device="cuda", dtype="bfloat16", mxfp4_moe="triton_kernels")
    sp = SamplingParams(max_new_tokens=20, ignore_eos=True)
    ar = Engine.from_dirs(target, None, RuntimeConfig(block_size=1, **cfg))
    df = Engine.from_dirs(target, drafter, RuntimeConfig(**cfg))
    assert type(df.target.layers[0].mlp.experts).__name__ == "TritonKernelsExperts"
    assert df.target.layers[0].mlp.experts.library is not None
    out_ar, out_df = [o.output_ids for o in ar.generate(ps, sp)], [o.output_ids for o in df.generate(ps, sp)]
    assert all(len(a) == len(d) == 20 and a[0] == d[0] for a, d in zip(out_ar, out_df)), (out_ar, out_df)


def test_flags_parse_and_each_matmul_runs_under_its_own_constraints():
    Flags = triton_kernels_moe.Flags
    assert Flags() == Flags.parse("") == Flags({"split_k": 1}, {"split_k": 1}, 4)   # vLLM's, 4 warps (measured)
    f = Flags.parse("fc2.block_k=256+fc2.num_stages=4+fc1.split_k=2+scale_warps=4")
    assert f == Flags({"split_k": 2}, {"split_k": 1, "block_k": 256, "num_stages": 4}, 4)
    for bad, words in (("fc2.block_k", "is not KEY=INTEGER"), ("fc3.block_k=1", "names neither"),
                       ("fc2.block_k=big", "is not KEY=INTEGER")):
        with pytest.raises(DFlashError, match=words):
            Flags.parse(bad)
    seen, current = [], {}

    class OptFlags:   # the library's module-level constraints, as matmul_ogs reads them at launch
        @staticmethod
        def reset_opt_flags_constraints():
            current.clear()

        @staticmethod
        def update_opt_flags_constraints(c):
            current.update(c)

    lib = object.__new__(triton_kernels_moe.MatmulOgsExperts)
    lib.tk, lib.flags = {"opt_flags": OptFlags}, f
    for which in (f.fc1, f.fc2):
        lib._constrain(which)
        seen.append(dict(current))
    assert seen == [f.fc1, f.fc2]


def test_compare_names_take_opt_flags():
    lib = gpt_oss_step.library("triton_kernels:fc2.block_k=256")
    assert lib.experts.keywords["flags"] == triton_kernels_moe.Flags(fc2={"split_k": 1, "block_k": 256})
    assert gpt_oss_step.library("flashinfer") is gpt_oss_step.LIBRARIES["flashinfer"]
    for name, words in (("flashinfer:fc2.block_k=1", "unknown library"), ("vllm", "unknown library"),
                        ("triton_kernels:fc9.x=1", "names neither")):
        with pytest.raises(SystemExit, match=words):
            gpt_oss_step.library(name)
