# SPDX-License-Identifier: Apache-2.0
"""Stage 3: ModelOpt's ``export_speculative_decoding`` -> the canonical z-lab drafter in ``<out>/drafter``, then
three checks that the file is the model that was trained and that our runtime runs it correctly:

  rope    the exported RoPE (theta, type) gives exactly the frequencies the draft trained with
  parity  our runtime's drafter (``runtime.weights``) and ModelOpt's draft module, same weights, same random
          context features and block: same hidden states (float32)
  greedy  DFlash greedy decoding == autoregressive greedy decoding on training prompts (float32), with tau
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from ..checkpoints import drafter_formats, hf
from ..config import RuntimeConfig, SamplingParams
from ..errors import DFlashError
from ..model_config import rope_parameters
from ..runtime.models.layers import rope_inv_freq
from .modelopt_model import versions
from .settings import TrainConfig

DRAFTER_DIR = "drafter"
PARITY_TOL = 1e-4  # max |difference| / max |value| of the final hidden states, float32 on both sides


def export(cfg: TrainConfig, model, target_dir: Path, provenance: dict, log=print) -> Path:
    """Write ``<out>/drafter`` (config.json + model.safetensors, canonical z-lab layout) atomically."""
    from modelopt.torch.export import export_speculative_decoding

    out = cfg.out_dir
    final = out / DRAFTER_DIR
    with tempfile.TemporaryDirectory(prefix=".export-", dir=out) as tmp:
        raw, canon = Path(tmp) / "modelopt", Path(tmp) / DRAFTER_DIR
        export_speculative_decoding(model, dtype=getattr(torch, cfg.export_dtype), export_dir=str(raw))
        norm = drafter_formats.normalise(raw, canon, target_dir, hf.read_config(target_dir), fmt="modelopt")
        config = json.loads((canon / "config.json").read_text())
        config["torch_dtype"] = cfg.export_dtype
        config["dflash_trained"] = True  # dflash-build / dflash-generate say "untrained" only when this is false
        config["dflash_training"] = {"tool": "dflash-train (trtllm-dflash)", **provenance,
                                     "modelopt": versions()["nvidia-modelopt"]}
        (canon / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for f in canon.iterdir():
            f.chmod(0o644)  # safetensors writes owner-only files; the drafter ships with the project
        if final.exists():
            trash = Path(tempfile.mkdtemp(prefix=".drafter.old-", dir=out))
            os.replace(final, trash / DRAFTER_DIR)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(canon, final)
    size = sum(f.stat().st_size for f in final.iterdir())
    log(f"export: {final} ({size / 1e6:.1f} MB; {'; '.join(norm.notes) or 'already canonical'})")
    return final


def check_rope(model, drafter_dir: Path, target_dir: Path) -> dict:
    cfg, target = hf.read_config(drafter_dir), hf.read_config(target_dir)
    params, theta = rope_parameters(cfg), rope_parameters(target)["rope_theta"]
    if float(params["rope_theta"]) != float(theta):
        raise DFlashError("exported rope_theta", f"is {params['rope_theta']}, the target's is {theta}",
                          "ModelOpt exports once wrote the default 10000 here; report the ModelOpt version")
    want, _ = rope_inv_freq(params, cfg["head_dim"], cfg.get("max_position_embeddings", 4096))
    got = model.dflash_module.rotary_emb.inv_freq.double().cpu()
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-5):
        raise DFlashError("exported RoPE", "differs from the RoPE the draft trained with",
                          "re-export with the same ModelOpt/transformers versions used for training")
    return {"rope_theta": float(theta), "rope_type": params["rope_type"], "ok": True}


@torch.no_grad()
def check_parity(model, drafter_dir: Path, export_dtype: str, ctx_len: int = 24, seed: int = 0) -> dict:
    """Our runtime's drafter vs ModelOpt's draft module on random features (weights rounded like the export)."""
    from ..runtime.distributed import TPGroup
    from ..runtime.kv_cache import KVCache
    from ..model_config import DrafterConfig
    from ..runtime.weights import load_drafter

    device = torch.device("cpu")  # float32 on CPU: no kernel differences between the two sides
    ref = copy.deepcopy(model.dflash_module).to(device).float().eval()
    for p in ref.parameters():
        p.copy_(p.to(getattr(torch, export_dtype)).float())
    cfg = hf.read_config(drafter_dir)
    B, hidden = cfg["block_size"], model.config.hidden_size
    n_feat = len(cfg["dflash_config"]["target_layer_ids"])
    ours = load_drafter(drafter_dir, DrafterConfig.from_hf(cfg), hidden, TPGroup(0, 1), device, torch.float32,
                        ctx_len + B)
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(1, ctx_len, n_feat * hidden, generator=g)
    ids = torch.full((1, B), cfg["dflash_config"]["mask_token_id"])
    ids[0, 0] = int(torch.randint(cfg["vocab_size"], (1,), generator=g))
    x = model.get_input_embeddings().weight[ids.to(model.device)].float().to(device)
    pos = torch.arange(ctx_len + B)[None]
    want = ref(noise_embedding=x, target_hidden=feats, position_ids=pos, attention_mask=None)
    cache = KVCache(*ours.kv_shape()[:1], 1, ours.kv_shape()[1], ctx_len + B, ours.kv_shape()[2], torch.float32, device)
    ours.append_context(feats, pos[:, :ctx_len], cache, slice(0, 1))
    # kv_len covers the block rows too: the engine passes ctx_len + B (newer runtimes cache the block K/V there)
    got = ours(x, pos[:, ctx_len:], torch.tensor([ctx_len]), cache, slice(0, 1), ctx_len + B)
    rel = float((got - want).abs().max() / want.abs().max())
    if not rel <= PARITY_TOL:
        raise DFlashError("exported drafter", f"computes differently in our runtime than in ModelOpt "
                          f"(relative difference {rel:.2e} > {PARITY_TOL:g})",
                          "the export and runtime disagree on the layout; report this with both versions")
    return {"max_rel_diff": rel, "ok": True}


def check_greedy(cfg: TrainConfig, target_dir: Path, drafter_dir: Path, prompts: list[list[int]]) -> dict:
    """DFlash greedy output must equal AR greedy output token for token (float32, so kernels cannot tip ties)."""
    from ..runtime.engine import Engine

    rc = RuntimeConfig(max_batch_size=len(prompts), block_size=None, dtype="float32", device=cfg.device,
                       max_seq_len=max(map(len, prompts)) + cfg.verify_max_new_tokens + 2 * cfg.block_size)
    params = SamplingParams(max_new_tokens=cfg.verify_max_new_tokens)
    engine = Engine.from_dirs(target_dir, None, replace(rc, block_size=1))
    ar = [r.output_ids for r in engine.generate(prompts, params)]
    del engine  # one engine at a time: each holds the whole target in float32
    dflash = Engine.from_dirs(target_dir, drafter_dir, rc).generate(prompts, params)
    same = [r.output_ids == a for r, a in zip(dflash, ar)]
    taus = [r.stats.tau for r in dflash if r.stats.acceptance_lengths]
    result = {"prompts": len(prompts), "identical": sum(same), "tau": round(sum(taus) / max(len(taus), 1), 3),
              "ok": all(same)}
    if not all(same):
        raise DFlashError("exported drafter", f"DFlash greedy output differs from AR greedy output on "
                          f"{len(same) - sum(same)} of {len(same)} prompts", "this is a runtime bug: report it")
    return result
