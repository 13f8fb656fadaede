# SPDX-License-Identifier: Apache-2.0
"""gpt-oss on the decode kernels, on the CPU in Triton's interpreter: the attention kernel with sinks and the
sliding window (runtime/kernels/decode_attention.py) against the torch path it replaces (gpt_oss.attend_with_sinks)
and a float64 reference; the router's top-k + softmax kernel (runtime/kernels/router.py) against torch.topk +
softmax and a float64 reference, ties included; the fused add + norm against the eager one; and a tiny gpt-oss
target (sliding window 8, sinks, YaRN, MXFP4 experts dequantised) whose forward and whose engine's greedy tokens
(AR and DFlash) are the same with kernels "triton" as with "torch".

float32 and float16 only (the interpreter's tl.dot has no bfloat16; tests/gpu/test_gpt_oss_kernels_cuda.py runs
bf16 at gpt-oss-20b shapes). Tolerances as tests/runtime/test_decode_attention.py's: float32 1e-5 relative
(float32 accumulation in another order; a wrong mask or a lost sink is O(1e-2) or more), float16 2e-3 (exact fp16
inputs, one rounding of the output and of the probabilities fed to P @ V, 2^-11 relative each).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.runtime.compare import attend_f64, default_subset, random_cache, rel
from trtllm_dflash.checkpoints import hf
from trtllm_dflash.model_config import target_config
from trtllm_dflash.runtime.kv_cache import KVCache
from trtllm_dflash.runtime.models import gpt_oss
from trtllm_dflash.runtime.models import layers as L

if not torch.cuda.is_available():
    # before the kernels are imported: triton.jit picks the interpreter when it decorates them
    os.environ["TRITON_INTERPRET"] = "1"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def kernels():
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    from trtllm_dflash.runtime.kernels import decode_attention, router
    return decode_attention, router


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("case", [
    # (G, T, window, splits): decode and DFlash verify blocks; the window larger than the context, smaller (the
    # block straddles its edge: each row's lo differs), and full layers split over the cache
    (4, 1, None, 1), (4, 1, 24, 1), (2, 5, 24, 1), (2, 8, 24, 3), (4, 4, 1000, 2), (1, 16, None, 3), (8, 2, 7, 1)])
def test_attend_with_sinks_and_window_equals_torch_and_float64(dtype, tol, case):
    K, _ = kernels()
    G, T, window, splits = case
    n, Hkv, d, S, kv_len = 2, 2, 16, 320, 300
    g = torch.Generator().manual_seed(G * 100 + T)
    cache = random_cache(3, Hkv, S, d, dtype, kv_len, g)   # keys past kv_len must never count
    q = torch.randn(n, T, G * Hkv, d, generator=g).to(dtype)
    sinks = (torch.randn(G * Hkv, generator=g) + 4).to(dtype)    # comparable to the keys' mass at 300 keys
    rows = torch.tensor([2, 0])
    pos = torch.tensor([[290 - T], [150]]) + torch.arange(T)                     # [n, T], as the runner's
    keys = L.KeyRange.causal(pos, window)
    visible = keys.mask(kv_len)
    k, v = (x.clone() for x in cache.read(0, rows, kv_len))
    if window is not None and window < 200:   # keys below the tile of the lowest lo must not even be read
        cache.v[:, :, :, :int(keys.lo.min()) // 64 * 64] = float("nan")
    want = attend_f64(q, k, v, visible, d ** -0.5, sinks)
    ref = gpt_oss.attend_with_sinks(q.transpose(1, 2), k, v, visible, sinks, d ** -0.5)
    span = None if window is None else window + T - 1
    out = K.attend(q, cache.k[0], cache.v[0], rows, kv_len, keys.lo, keys.hi, d ** -0.5, splits=splits,
                   sinks=sinks, span=span)
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel(out, want) < tol and rel(out, ref) < 2 * tol
    # the sinks matter here (a kernel that dropped them would fail above)
    assert rel(attend_f64(q, k, v, visible, d ** -0.5, sinks - 1e4), want) > 10 * tol


@pytest.mark.parametrize("splits", [1, 2])
def test_rows_that_see_no_key_give_zero_with_sinks(splits):
    """A row whose range is empty puts all its mass on the sink: output 0, as the torch path; and a span hint
    smaller than the rows' real spread still attends every visible key (the last split runs to the end)."""
    K, _ = kernels()
    n, T, Hkv, G, d, kv_len = 1, 3, 1, 2, 16, 200
    g = torch.Generator().manual_seed(5)
    cache = KVCache(1, 1, Hkv, kv_len, d, torch.float32, "cpu")
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    q = torch.randn(n, T, G * Hkv, d, generator=g)
    sinks = torch.randn(G * Hkv, generator=g)
    keys = L.KeyRange(torch.tensor([[5, 10, 0]]), torch.tensor([[4, 190, 199]]))   # row 0 empty
    visible = keys.mask(kv_len)
    k, v = cache.read(0, torch.tensor([0]), kv_len)
    out = K.attend(q, cache.k[0], cache.v[0], torch.tensor([0]), kv_len, keys.lo, keys.hi, d ** -0.5,
                   splits=splits, sinks=sinks, span=4)
    assert out[:, 0].abs().max() == 0
    assert rel(out, attend_f64(q, k, v, visible, d ** -0.5, sinks)) < 1e-5
    assert rel(out, gpt_oss.attend_with_sinks(q.transpose(1, 2), k, v, visible, sinks, d ** -0.5)) < 1e-5


def test_attend_rejects_malformed_sinks():
    K, _ = kernels()
    cache = KVCache(1, 1, 1, 64, 16, torch.float32, "cpu")
    q, pos = torch.zeros(1, 1, 2, 16), torch.tensor([[3]])
    with pytest.raises(ValueError, match="sinks"):
        K.attend(q, cache.k[0], cache.v[0], torch.tensor([0]), 8, pos * 0, pos, 0.25, sinks=torch.zeros(3))


# ---- router -------------------------------------------------------------------------------------------
def topk_f64(logits: torch.Tensor, k: int):
    """The documented rule in float64: a stable descending sort (ties: lower id first), softmax over the k."""
    order = torch.sort(logits.double(), dim=-1, descending=True, stable=True).indices[:, :k]
    return order, logits.double().gather(1, order).softmax(-1)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 1e-3)])
@pytest.mark.parametrize("E,k", [(32, 4), (20, 4), (4, 2), (128, 4), (8, 8)])
def test_router_topk_softmax_equals_torch_and_float64(dtype, tol, E, k):
    """Tie-free logits: ids exactly torch.topk's, weights torch.softmax's within one rounding of the output
    (float16 2^-11 relative; float32: exp of another implementation, ~1e-7)."""
    _, R = kernels()
    g = torch.Generator().manual_seed(E * 10 + k)
    N = 7
    logits = (torch.randperm(N * E, generator=g).view(N, E).float() / 50 - 3).to(dtype)   # distinct values
    ids, w = R.topk_softmax(logits, k)
    top, ref_ids = logits.topk(k, dim=-1)
    assert ids.dtype == torch.int64 and w.dtype == dtype and ids.shape == w.shape == (N, k)
    assert ids.equal(ref_ids)
    assert rel(w, torch.softmax(top, dim=-1)) < tol
    want_ids, want_w = topk_f64(logits, k)
    assert ids.equal(want_ids) and rel(w, want_w) < tol


def test_router_ties_take_the_lower_expert_first():
    _, R = kernels()
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0, 2.0],      # a three-way tie at the top
                           [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],      # all equal
                           [2.0, 1.0, 1.0, 1.0, -1.0, 1.0],     # a tie across the k-th place
                           [-float("inf")] * 5 + [0.0]])        # -inf logits are still chosen, by id
    ids, w = R.topk_softmax(logits, 3)
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2], [0, 1, 2], [5, 0, 1]]
    want_ids, want_w = topk_f64(logits, 3)
    assert ids.equal(want_ids) and rel(w, want_w) < 1e-6
    # torch.topk: the same set where no tie straddles the k-th place (row 0); its order among ties, and which
    # of the tied ids it takes at the k-th place, is whatever its selection algorithm gives (on CPU, rows 1 and
    # 2 come out [3, 5, 4] and [0, 3, 5]), so that is not a rule a kernel can follow: ours is documented instead
    assert sorted(logits[:1].topk(3).indices[0].tolist()) == sorted(ids[0].tolist())


ROUTER_SM90 = '''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from trtllm_dflash.runtime.kernels import router as R
k = R._topk_softmax_kernel
for E, K, dtype, warps in [(32, 4, "*bf16", 1), (128, 4, "*bf16", 2), (4, 2, "*fp32", 1)]:   # 20b, 120b, tiny
    consts = dict(K=K, BLOCK_E=triton.next_power_of_2(E), BLOCK_K=triton.next_power_of_2(K))
    types = {"logits_ptr": dtype, "ids_ptr": "*i64", "w_ptr": dtype}
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in k.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names) if sig[n].startswith("*")}
    triton.compile(ASTSource(k, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
'''


def test_router_kernel_compiles_for_the_h100():
    """The top-k kernel compiled to sm_90 (the interpreter accepts code the compiler refuses)."""
    from tests.runtime.compare import compile_for_h100
    compile_for_h100(ROUTER_SM90)


def test_router_rejects_bad_k():
    _, R = kernels()
    with pytest.raises(ValueError, match="top-5 of 4"):
        R.topk_softmax(torch.zeros(2, 4), 5)


# ---- add + norm ---------------------------------------------------------------------------------------
def test_fused_add_norm_is_the_eager_one():
    """``fused=True`` with o_proj's bias == the eager add-bias, add, norm (on CPU the same ops run eagerly; the
    GPU test compares the compiled kernel)."""
    g = torch.Generator().manual_seed(0)
    norm = gpt_oss.GptOssRMSNorm(64, 1e-5)
    norm.weight.data.copy_(torch.rand(64, generator=g) + 0.5)
    x, res, bias = (torch.randn(3, 5, 64, generator=g).half() for _ in range(3))
    bias = bias[0, 0]
    want_total = res + (x + bias)
    want = norm(want_total)
    got, total = norm(x, res, bias=bias, fused=True)
    assert total.equal(want_total) and got.equal(want)
    assert norm(x, fused=True).equal(norm(x))


# ---- the tiny target ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory):
    from trtllm_dflash.testing import write_gpt_oss_drafter, write_tiny_gpt_oss
    root = Path(tmp_path_factory.mktemp("gpt_oss_kernels"))
    target = write_tiny_gpt_oss(root / "mxfp4", mxfp4=True, seed=1)
    return target, write_gpt_oss_drafter(target, root / "drafter")


def test_target_forward_with_the_kernels(tiny_gpt_oss, monkeypatch):
    """Prefill then a verify block of 6 over the cache (window 8: the block straddles the window edge; row 1
    two positions back, its stale rows hidden), with the kernels == the torch path, float32; the router's
    top-k kernel ran in every layer of the three forwards."""
    _, R = kernels()
    from tests.runtime.kernel_engine import count_calls
    calls = count_calls(monkeypatch, R, ["topk_softmax"], {})
    from trtllm_dflash.runtime.distributed import TPGroup
    from trtllm_dflash.runtime.kernels import Kernels
    from trtllm_dflash.runtime.weights import load_target
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(2, 90, (2, 30), generator=g)
    out = {}
    for kernel in ("torch", "triton"):
        target = load_target(tiny_gpt_oss[0], target_config(hf.read_config(tiny_gpt_oss[0])),
                             TPGroup(), torch.device("cpu"),
                             torch.float32, 64,
                             kernels=Kernels.choose(kernel, False, "cpu", torch.float32))
        assert all(layer.self_attn.kernels.triton == (kernel == "triton") for layer in target.layers)
        L_, H, D = target.kv_shape()
        cache = KVCache(L_, 3, H, 64, D, torch.float32, "cpu")
        with torch.no_grad():
            target(ids[:, :20], torch.arange(20).expand(2, 20), cache, slice(0, 2), None)   # prefill 20 tokens
            pos = torch.tensor([[20], [18]]) + torch.arange(6)
            h, _ = target(ids[:, 20:26], pos, cache, slice(0, 2), 40)                   # verify 6
            h1, _ = target(ids[:, 26:27], pos[:, -1:] + 1, cache, slice(0, 2), 40)      # one AR step
        out[kernel] = (h, h1, cache.k.clone())
    for a, b in zip(out["triton"], out["torch"]):
        assert rel(a, b) < 1e-5
    assert calls == {"topk_softmax": 12}, calls   # 4 layers x (prefill, verify, AR step)


# exhaustive (13 minutes of a loaded 2-core box, ~2.5 of CPU): the default run has each gpt-oss kernel in the unit
# tests above and all of them in one target forward (test_target_forward_with_the_kernels)
@pytest.mark.parametrize("block", default_subset([None, 1], keep=()))
def test_engine_tokens_are_the_same_with_the_kernels(tiny_gpt_oss, block, monkeypatch):
    """Greedy generation of the tiny gpt-oss target (AR, and DFlash with its drafter) past the sliding window,
    with attention, router and norms on the kernels == the torch path, float32; the kernels did run."""
    K, R = kernels()
    from tests.runtime.kernel_engine import count_calls, same_generation
    from trtllm_dflash.config import SamplingParams
    calls = count_calls(monkeypatch, K, ["attend", "rope_cache_write"], {})
    count_calls(monkeypatch, R, ["topk_softmax"], calls)
    drafter = tiny_gpt_oss[1] if block is None else None
    same_generation(tiny_gpt_oss[0], drafter, dict(max_seq_len=64, max_batch_size=2, block_size=block),
                    [[5, 9, 14, 3, 22, 7, 7, 30, 2, 11, 19], [7, 41]],
                    SamplingParams(max_new_tokens=12, ignore_eos=True))   # 11 + 12 > 2 windows
    assert min(calls.values()) > 0 and len(calls) == 3, calls
