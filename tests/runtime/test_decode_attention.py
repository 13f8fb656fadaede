# SPDX-License-Identifier: Apache-2.0
"""The Triton decode-path kernels (runtime/kernels/decode_attention.py) on the CPU, in Triton's interpreter:
each against the torch path it replaces and against a float64 reference; the KeyRange bounds against the torch
masks; and a tiny target/drafter pair whose greedy and sampled tokens are the same with the kernels as without.

The interpreter runs each program in numpy, so shapes are tiny. float32 and float16 only: the interpreter's
``tl.dot`` is wrong for bfloat16 (numpy has no bfloat16); tests/gpu/test_decode_attention_cuda.py covers bf16.
Tolerances: float32 compares at 1e-5 relative (fp32 accumulation in another order; an indexing mistake is O(1));
float16 at 2e-3 (inputs are exact fp16, one rounding of the output and of the probabilities fed to P @ V,
2^-11 relative each). Skipped only where triton is not installed (scripts/setup_env.sh installs it for CI).
"""
from __future__ import annotations

import os

import pytest
import torch

from tests.runtime.compare import attend_f64, compile_for_h100, default_subset, random_cache, rel, rope_f64
from tests.runtime.kernel_engine import GREEDY_AND_SAMPLED, TWO_PROMPTS, count_calls, same_generation
from trtllm_dflash.checkpoints import hf
from trtllm_dflash.model_config import target_config
from trtllm_dflash.config import RuntimeConfig
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.kernels import TORCH, Kernels
from trtllm_dflash.runtime.kv_cache import KVCache
from trtllm_dflash.runtime.models import layers as L

if not torch.cuda.is_available():
    # before the kernels are imported: triton.jit picks the interpreter when it decorates them
    os.environ["TRITON_INTERPRET"] = "1"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def kernels():
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    from trtllm_dflash.runtime.kernels import decode_attention
    return decode_attention


def inputs(n, T, Hq, Hkv, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, T, Hq + 2 * Hkv, d, generator=g).to(dtype)
    q, k, v = qkv.split([Hq, Hkv, Hkv], dim=2)   # strided views, as the qkv GEMM's output is
    w = (torch.rand(2, d, generator=g) + 0.5).to(dtype)
    return q, k, v, w[0], w[1]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("with_q,norm,rows", [(True, True, "index"), (True, False, "slice"), (False, True, "index")])
def test_rope_cache_write_equals_the_torch_path_and_float64(dtype, tol, with_q, norm, rows):
    K = kernels()
    n, T, Hq, Hkv, d, S = 2, 3, 6, 2, 16, 24
    q, k, v, qw, kw = inputs(n, T, Hq, Hkv, d, dtype)
    q = q if with_q else None
    qw, kw = (qw, kw) if norm else (None, None)
    pos = torch.tensor([[5, 6, 7], [0, 1, 2]])
    rot = L.Rotary({"rope_theta": 10000.0, "rope_type": "default"}, d, S, S)
    cos, sin = rot.tables(pos, dtype)
    r = torch.tensor([3, 1]) if rows == "index" else slice(0, 2)
    ref_cache, cache = (KVCache(2, 4, Hkv, S, d, dtype, "cpu") for _ in range(2))
    q_ref, k_ref = L.rope_cache_write(q, k, v, cos, sin, qw, kw, 1e-6, ref_cache, 1, r, pos)
    q_out, k_out = L.rope_cache_write(q, k, v, cos, sin, qw, kw, 1e-6, cache, 1, r, pos, Kernels(triton=True))
    assert cache.v.equal(ref_cache.v)                       # v is copied bit for bit
    assert rel(cache.k, ref_cache.k) < tol and rel(k_out, k_ref) < tol
    assert rel(k_out, rope_f64(k, cos, sin, kw, 1e-6)) < tol
    ids = ref_cache.row_ids(r)
    assert rel(cache.k[1][ids[:, None], :, pos], k_out) == 0   # the cache holds exactly what was returned
    assert cache.k[0].abs().sum() == 0 and cache.k[1][2].abs().sum() == 0   # nothing else written
    if with_q:
        assert rel(q_out, q_ref) < tol and rel(q_out, rope_f64(q, cos, sin, qw, 1e-6)) < tol
    else:
        assert q_out is None
    _, no_k = L.rope_cache_write(q, k, v, cos, sin, qw, kw, 1e-6, cache, 1, r, pos, Kernels(triton=True),
                                 want_k=False)
    assert no_k is None


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("G,T,d,splits", [(3, 1, 16, 1), (3, 4, 32, 3), (1, 5, 16, 2), (4, 16, 16, 4)])
def test_attend_equals_the_torch_path_and_float64(dtype, tol, G, T, d, splits):
    K = kernels()
    n, Hkv, S, kv_len = 2, 2, 300, 256
    g = torch.Generator().manual_seed(G * 100 + T)
    cache = random_cache(3, Hkv, S, d, dtype, kv_len, g)   # keys past kv_len must never count
    q = torch.randn(n, T, G * Hkv, d, generator=g).to(dtype)
    rows = torch.tensor([2, 0])
    pos = torch.tensor([[140], [250 - T]]) + torch.arange(T)                 # [n, T]
    lo = torch.tensor([[0], [60]]) + torch.arange(T)                          # row 1: a sliding window
    hi = torch.stack([pos[0], (pos[1] + 3).clamp(max=kv_len + 5)])           # row 1: keys ahead, past kv_len
    keys = L.KeyRange(lo, hi)
    visible = keys.mask(kv_len)
    k, v = cache.read(0, rows, kv_len)
    ref = L.attend(q.transpose(1, 2), k, v, L.group_mask(visible, G), d ** -0.5)
    want = attend_f64(q, k, v, visible, d ** -0.5)
    out = K.attend(q, cache.k[0], cache.v[0], rows, kv_len, lo, hi, d ** -0.5, splits=splits)
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel(out, want) < tol and rel(out, ref) < 2 * tol
    assert rel(L.attend_cache(q, cache, 0, rows, kv_len, keys, d ** -0.5), want) < tol   # default splits


def drafter_with(layer_causal, layer_window, B=4, seed=0, kernels_=TORCH):
    """A random DFlash drafter whose layers are causal or not and windowed or not (as sliding-window drafters)."""
    from trtllm_dflash.model_config import DrafterConfig
    from trtllm_dflash.runtime.distributed import TPGroup
    from trtllm_dflash.runtime.models.dflash import DFlashDrafter
    n = len(layer_causal)
    c = DrafterConfig(block_size=B, mask_token_id=0, target_layer_ids=(0,), num_target_layers=2, vocab_size=8,
                      hidden_size=64, intermediate_size=64, num_layers=n, num_heads=6, num_kv_heads=2, head_dim=16,
                      rms_norm_eps=1e-6, rope={"rope_theta": 1e4, "rope_type": "default"},
                      max_position_embeddings=128, attention_bias=False, layer_causal=tuple(layer_causal),
                      layer_window=tuple(layer_window))
    torch.manual_seed(seed)
    drafter = DFlashDrafter(c, 64, TPGroup(), 128, kernels_)
    with torch.no_grad():
        for p in drafter.parameters():
            p.normal_(0, 0.2) if p.dim() == 2 else p.uniform_(0.5, 1.5)
    return drafter


def test_key_ranges_equal_the_torch_masks():
    """The target's and the drafter's KeyRange (what the kernel reads) against the boolean masks of the torch
    path (what the reference attends with), for causal, non-causal and sliding-window drafter layers."""
    B, kv_len = 4, 40
    start = torch.tensor([3, 17, 30])
    pos = start[:, None] + torch.arange(B)
    rel_ = torch.arange(kv_len)[None, None, :] - start[:, None, None]
    drafter = drafter_with([False, True, False, True], [None, None, 3, 5], B)
    for i in range(4):
        assert drafter._keys(i, pos, start, B).mask(kv_len).equal(drafter._mask(i, rel_, B)), i
    target_mask = (torch.arange(kv_len)[None, None, :] <= pos[:, :, None])[:, None]
    assert L.KeyRange(torch.zeros_like(pos), pos).mask(kv_len).equal(target_mask)


def test_drafter_forward_with_the_kernels():
    """A drafter with full, causal and windowed layers: context appended, then the block's forward, with the
    kernels == the torch path (float32), for two requests at different context lengths in slots 2 and 0."""
    kernels()
    B, S = 4, 64
    out = {}
    for kernel in ("torch", "triton"):
        drafter = drafter_with([False, True, False], [None, None, 3], B,
                               kernels_=Kernels.choose(kernel, False, "cpu", torch.float32))
        assert drafter.layers[1].mlp.kernels.triton == (kernel == "triton")
        cache = KVCache(3, 3, 2, S, 16, torch.float32, "cpu")
        g = torch.Generator().manual_seed(1)
        rows, start = torch.tensor([2, 0]), torch.tensor([9, 20])
        ctx_pos = torch.arange(20).expand(2, 20)
        drafter.append_context(torch.randn(2, 20, 64, generator=g), ctx_pos, cache, rows)
        x = torch.randn(2, B, 64, generator=g)
        pos = start[:, None] + torch.arange(B)
        out[kernel] = (drafter(x, pos, start, cache, rows, 32), cache.k.clone(), cache.v.clone())
    assert rel(out["triton"][0], out["torch"][0]) < 1e-5
    assert rel(out["triton"][1], out["torch"][1]) < 1e-5 and rel(out["triton"][2], out["torch"][2]) < 1e-5


def test_target_forward_with_the_kernels(tiny_qwen3_pair):
    """The target's verify forward over a cache (positions a strided slice, as the runner's are) with the kernels
    == the torch path, float32."""
    kernels()
    from trtllm_dflash.runtime.weights import load_target
    from trtllm_dflash.runtime.distributed import TPGroup
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(2, 90, (2, 30), generator=g)
    out = {}
    for kernel in ("torch", "triton"):
        target = load_target(tiny_qwen3_pair[0], target_config(hf.read_config(tiny_qwen3_pair[0])),
                             TPGroup(), torch.device("cpu"),
                             torch.float32, 64,
                             kernels=Kernels.choose(kernel, False, "cpu", torch.float32))
        L_, H, D = target.kv_shape()
        cache = KVCache(L_, 3, H, 64, D, torch.float32, "cpu")
        target(ids[:, :20], torch.arange(20).expand(2, 20), cache, slice(0, 2), None)   # prefill 20 tokens
        pos = torch.tensor([[20], [18]]) + torch.arange(16)
        h, _ = target(ids[:, 20:26], pos[:, :6], cache, slice(0, 2), 40)                 # verify 6 (row 1: 2 back)
        out[kernel] = h
    assert rel(out["triton"], out["torch"]) < 1e-5


def test_kernels_setting():
    assert RuntimeConfig().kernels == "auto"
    with pytest.raises(DFlashError, match="kernels"):
        RuntimeConfig(kernels="cuda")
    assert Kernels.choose("torch", False, "cuda", torch.bfloat16) == TORCH
    assert Kernels.choose("auto", True, "cpu", torch.float32) == TORCH   # float32 CPU BLAS is not row-invariant
    assert Kernels.choose("auto", True, "cpu", torch.bfloat16) == Kernels(batch_invariant=True)
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        with pytest.raises(DFlashError, match="kernels: 'triton' runs on CUDA GPUs only"):
            Kernels.choose("triton", False, "cpu", torch.float32)
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def test_the_old_attention_kernel_name_is_read_with_a_warning():
    # deployment directories and scripts written before the rename say runtime.attention_kernel
    with pytest.warns(FutureWarning, match="attention_kernel is deprecated: it is now 'kernels'"):
        assert RuntimeConfig(attention_kernel="torch").kernels == "torch"
    with pytest.warns(FutureWarning), pytest.raises(DFlashError, match="kernels: unknown value 'cuda'"):
        RuntimeConfig(attention_kernel="cuda")
    with pytest.raises(DFlashError, match="attention_kernel: 'torch' contradicts kernels 'triton'"):
        RuntimeConfig(kernels="triton", attention_kernel="torch")


def test_the_engine_refuses_models_built_with_other_kernels(tiny_qwen3_pair):
    # the kernels are fixed when a module is built: an engine whose config asks for others must not run them
    from trtllm_dflash.runtime.distributed import TPGroup
    from trtllm_dflash.runtime.engine import Engine
    from trtllm_dflash.runtime.weights import load_target
    target = load_target(tiny_qwen3_pair[0], target_config(hf.read_config(tiny_qwen3_pair[0])),
                         TPGroup(), torch.device("cpu"),
                         torch.bfloat16, 64,
                         kernels=Kernels(batch_invariant=True))
    with pytest.raises(DFlashError, match="kernels: the target was built with"):
        Engine(target, None, None, RuntimeConfig(max_seq_len=64, block_size=1, dtype="bfloat16"), TPGroup(), set())
    engine = Engine(target, None, None, RuntimeConfig(max_seq_len=64, block_size=1, dtype="bfloat16",
                                                      batch_invariant=True), TPGroup(), set())
    assert engine.kernels == Kernels(batch_invariant=True)


# By default DFlash (the drafter's block) only: AR's one-token steps are the T = 1 cases of the unit tests above
@pytest.mark.parametrize("block", default_subset([None, 1], keep=(0,)))
def test_engine_tokens_are_the_same_with_the_kernels(tiny_qwen3_pair, block, monkeypatch):
    """Greedy and sampled generation of a tiny Qwen3 pair (q/k norm, GQA, a DFlash drafter of block 8) with
    every attention in the Triton kernels (prefill cache writes included) == the torch path, float32."""
    calls = count_calls(monkeypatch, kernels(), ["attend", "rope_cache_write"], {})
    same_generation(*tiny_qwen3_pair, dict(max_seq_len=64, max_batch_size=2, block_size=block), TWO_PROMPTS,
                    GREEDY_AND_SAMPLED)
    assert calls["attend"] > 0 and calls["rope_cache_write"] > 0, calls


ATTEND_SM90 = '''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from trtllm_dflash.runtime.kernels import decode_attention as K
k = K._attend_kernel
types = {"q_ptr": "*bf16", "ck_ptr": "*bf16", "cv_ptr": "*bf16", "row_ptr": "*i64", "lo_ptr": "*i64", "hi_ptr": "*i64",
         "sink_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32", "ml_ptr": "*fp32", "cnt_ptr": "*i32",
         "scale_log2": "fp32"}
# (G, T, head_dim, BLOCK_N, splits, sinks, warps): SmolLM2 AR, Qwen3-8B verify, gpt-oss AR and verify, no split
for G, T, D, BN, splits, sink, warps in [(3, 1, 64, 64, 4, False, 4), (4, 16, 128, 32, 4, False, 8),
                                         (8, 1, 64, 64, 8, True, 4), (8, 10, 64, 64, 2, True, 8),
                                         (4, 1, 128, 32, 1, False, 4)]:
    consts = dict(G=G, D=D, BLOCK_M=max(16, triton.next_power_of_2(G * T)), BLOCK_N=BN, SPLITS=splits, IEEE=False,
                  SINK=sink, INVARIANT=False, KEY_CHUNK=K.KEY_CHUNK)
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in k.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names) if sig[n].startswith("*")}
    triton.compile(ASTSource(k, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
'''


def test_attend_compiles_for_the_h100():
    """The split-merging attention (a value defined in a runtime branch, an atomic) compiled to sm_90 cubins."""
    compile_for_h100(ATTEND_SM90)
