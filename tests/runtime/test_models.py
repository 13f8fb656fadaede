# SPDX-License-Identifier: Apache-2.0
"""Our target and drafter modules against independent references: HF transformers' own models, a float64
drafter written here from the paper's equations, and the `dflash` reference package."""
from __future__ import annotations

import math

import pytest
import torch

from tests.runtime.compare import rel
from trtllm_dflash.testing import VOCAB, write_tiny_target
from trtllm_dflash.checkpoints import hf
from trtllm_dflash.model_config import DrafterConfig, target_config
from trtllm_dflash.runtime.distributed import TPGroup
from trtllm_dflash.runtime.kv_cache import KVCache
from trtllm_dflash.runtime.weights import load_drafter, load_target

CPU, F32 = torch.device("cpu"), torch.float32


def _ours(path, capture=(), max_pos=256):
    m = load_target(path, target_config(hf.read_config(path)), TPGroup(), CPU, F32, max_pos, capture)
    L, H, D = m.kv_shape()
    return m, KVCache(L, 2, H, max_pos, D, F32, CPU)


TARGETS = {
    "llama": dict(arch="llama"),
    "llama_tied_llama3_rope": dict(arch="llama", tie=True, rope={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "llama_linear_rope": dict(arch="llama", rope={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    "qwen3_qk_norm_tied": dict(arch="qwen3", tie=True),
    "qwen3_untied": dict(arch="qwen3"),
}


@pytest.mark.parametrize("name", list(TARGETS))
def test_target_logits_and_features_match_transformers(tmp_path, name):
    from transformers import AutoModelForCausalLM
    kw = dict(TARGETS[name])
    path = write_tiny_target(tmp_path / name, kw.pop("arch"), **kw)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=F32).eval()
    ids = torch.randint(0, VOCAB, (2, 150), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
    capture = (0, 2, 1)
    ours, cache = _ours(path, capture)
    pos = torch.arange(150).expand(2, 150)
    with torch.no_grad():
        h, feats = ours(ids, pos, cache, torch.tensor([0, 1]), None)  # prefill path
        logits = ours.logits(h)
    assert rel(logits, out.logits) < 1e-4
    ref_feats = torch.cat([out.hidden_states[i + 1] for i in capture], -1)  # z-lab: layer i output = hidden_states[i+1]
    assert rel(feats, ref_feats) < 1e-4

    # decode path: prefill 100 tokens, then verify the next 50 as one block over the cache
    with torch.no_grad():
        ours(ids[:, :100], pos[:, :100], cache, torch.tensor([0, 1]), None)
        h2, _ = ours(ids[:, 100:], pos[:, 100:], cache, slice(0, 2), 150)
    assert rel(ours.logits(h2), out.logits[:, 100:]) < 1e-4


# ---- drafter --------------------------------------------------------------------------------------
def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta, d):
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos[:, None].double() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def reference_draft_hidden(dsd, dcfg, embed, feats, ctx_pos, block_ids, block_pos):
    """The paper's equations (§1.1 of the brief), float64, one request, no cache:
    H_t = RMSNorm_hidden(fc(features)); per layer K/V = [W_k H_t ; W_k h], [W_v H_t ; W_v h] with k_norm and
    RoPE at absolute positions; queries from the block only; attention NOT causal."""
    g = {k: v.double() for k, v in dsd.items()}
    eps, d = dcfg["rms_norm_eps"], dcfg["head_dim"]
    H, KV = dcfg["num_attention_heads"], dcfg["num_key_value_heads"]
    theta = dcfg.get("rope_parameters", {}).get("rope_theta", dcfg.get("rope_theta", 10000.0))
    ht = _rms(feats.double() @ g["fc.weight"].T, g["hidden_norm.weight"], eps)
    x = embed.double()[block_ids]
    all_pos = torch.cat([ctx_pos, block_pos])
    for i in range(dcfg["num_hidden_layers"]):
        p = f"layers.{i}."
        h = _rms(x, g[p + "input_layernorm.weight"], eps)
        q = _rms((h @ g[p + "self_attn.q_proj.weight"].T).view(-1, H, d), g[p + "self_attn.q_norm.weight"], eps)
        kin = torch.cat([ht, h])
        k = _rms((kin @ g[p + "self_attn.k_proj.weight"].T).view(-1, KV, d), g[p + "self_attn.k_norm.weight"], eps)
        v = (kin @ g[p + "self_attn.v_proj.weight"].T).view(-1, KV, d)
        q = _rope(q.transpose(0, 1), block_pos, theta, d)
        k = _rope(k.transpose(0, 1), all_pos, theta, d).repeat_interleave(H // KV, 0)
        v = v.transpose(0, 1).repeat_interleave(H // KV, 0)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), -1)  # no mask: block sees context + whole block
        x = x + (att @ v).transpose(0, 1).reshape(len(block_ids), -1) @ g[p + "self_attn.o_proj.weight"].T
        h = _rms(x, g[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ g[p + "mlp.gate_proj.weight"].T, h @ g[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ g[p + "mlp.down_proj.weight"].T
    return _rms(x, g["norm.weight"], eps)


def _drafter_inputs(tiny_pair, ctx=23):
    target, drafter = tiny_pair
    dcfg, dsd = hf.read_config(drafter), hf.load_state_dict(drafter)
    tsd = hf.load_state_dict(target)
    B = dcfg["block_size"]
    gen = torch.Generator().manual_seed(3)
    feats = torch.randn(ctx, len(dcfg["dflash_config"]["target_layer_ids"]) * 64, generator=gen)
    block = torch.tensor([5] + [dcfg["dflash_config"]["mask_token_id"]] * (B - 1))
    return dcfg, dsd, tsd["model.embed_tokens.weight"], feats, torch.arange(ctx), block, torch.arange(ctx, ctx + B)


def _our_draft_hidden(drafter_dir, embed, feats, ctx_pos, block, block_pos, cached_in_two_chunks=True):
    m = load_drafter(drafter_dir, DrafterConfig.from_hf(hf.read_config(drafter_dir)), 64, TPGroup(), CPU, F32, 256)
    L, H, D = m.kv_shape()
    cache = KVCache(L, 1, H, 256, D, F32, CPU)
    rows = slice(0, 1)
    with torch.no_grad():
        if cached_in_two_chunks:  # context arrives over two steps, as in decoding
            m.append_context(feats[None, :10], ctx_pos[None, :10], cache, rows)
            m.append_context(feats[None, 10:], ctx_pos[None, 10:], cache, rows)
        else:
            m.append_context(feats[None], ctx_pos[None], cache, rows)
        out = m(embed[block][None], block_pos[None], torch.tensor([len(ctx_pos)]), cache, rows, len(ctx_pos) + len(block))
    return out[0]


def test_drafter_matches_paper_equations_float64(tiny_pair):
    dcfg, dsd, embed, feats, ctx_pos, block, block_pos = _drafter_inputs(tiny_pair)
    ref = reference_draft_hidden(dsd, dcfg, embed, feats, ctx_pos, block, block_pos)
    ours = _our_draft_hidden(tiny_pair[1], embed, feats, ctx_pos, block, block_pos)
    assert rel(ours, ref) < 1e-5


def test_drafter_matches_dflash_reference_package(tiny_pair):
    dflash_model = pytest.importorskip("dflash.model", reason="the `dflash` reference package is not installed")
    dcfg, dsd, embed, feats, ctx_pos, block, block_pos = _drafter_inputs(tiny_pair)
    ref = dflash_model.DFlashDraftModel.from_pretrained(tiny_pair[1], dtype=F32).eval()
    with torch.no_grad():
        out = ref(position_ids=torch.cat([ctx_pos, block_pos])[None], noise_embedding=embed[block][None],
                  target_hidden=feats[None])[0]
    ours = _our_draft_hidden(tiny_pair[1], embed, feats, ctx_pos, block, block_pos, cached_in_two_chunks=False)
    assert rel(ours, out) < 1e-5
