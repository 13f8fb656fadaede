# SPDX-License-Identifier: Apache-2.0
"""A known model's shapes with random weights, written to disk as a Hugging Face target folder and a z-lab drafter
folder, so a benchmark can go through everything a user's checkpoint goes through (dflash-build, the loader, TP
sharding, the servers) without the real weights.

    python -m trtllm_dflash.bench.random_pair --model qwen3-8b --out /tmp/qwen3-8b-random

writes ``OUT/target`` (config.json, model-0000K-of-0000N.safetensors + model.safetensors.index.json, bf16) and
``OUT/drafter`` (the model's public DFlash drafter config, random weights). Each target tensor is drawn from its
own seed (crc32 of its name): ``bench.tp`` draws its in-memory shards with the same ``random_tensor`` on the GPU, so
drawn on a GPU (the default there) the target's weights are the ones that benchmark measures. Acceptance with a
random drafter is ~1: the figures are step costs and the serving path, not speed-ups.
``--smoke`` writes the same architecture at tiny widths (bench.step's ``shrink``) for a CPU check.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from trtllm_dflash.bench.step import drafter_config, target_config
from trtllm_dflash.checkpoints.drafter_init import random_drafter_weights
from trtllm_dflash.checkpoints.resolve import KNOWN_MODELS
from trtllm_dflash.errors import DFlashError, exit_code

SHARD_BYTES = 4 << 30   # as the Hub's 8B checkpoints: a few files of ~4 GB


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of the HF model ``cfg`` describes (built on the meta device: no memory)."""
    import transformers
    hf_cfg = transformers.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        meta = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    return {name: tuple(p.shape) for name, p in meta.named_parameters()}


def random_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """Norm weights 1, the rest N(0, 0.02) from the tensor's own seed (bench.tp's draw when ``device`` is CUDA;
    the CPU generator gives other numbers for the same seed)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype, device=device)
    g = torch.Generator(device).manual_seed(zlib.crc32(name.encode()))
    return torch.empty(shape, dtype=dtype, device=device).normal_(0, 0.02, generator=g)


def write_target(cfg: dict, out: Path, dtype: torch.dtype, device: str, shard_bytes: int = SHARD_BYTES) -> Path:
    """config.json + sharded safetensors + index; a shard is written as soon as it is full, so host memory holds
    one shard at a time."""
    from tqdm import tqdm
    out.mkdir(parents=True, exist_ok=True)
    shapes = tensor_shapes(cfg)
    size = torch.tensor([], dtype=dtype).element_size()
    groups, cur, cur_bytes = [], [], 0
    for name, shape in shapes.items():   # plan the shards first: their count goes in every file name
        nbytes = size * int(torch.Size(shape).numel())
        if cur and cur_bytes + nbytes > shard_bytes:
            groups.append(cur)
            cur, cur_bytes = [], 0
        cur.append(name)
        cur_bytes += nbytes
    groups.append(cur)
    weight_map, total = {}, 0
    with tqdm(total=sum(size * int(torch.Size(s).numel()) for s in shapes.values()), unit="B", unit_scale=True,
              desc=f"random {cfg['model_type']} weights", disable=None) as bar:
        for i, names in enumerate(groups, 1):
            fname = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
            shard = {}
            for name in names:
                shard[name] = random_tensor(name, shapes[name], dtype, device).cpu()
                bar.update(shard[name].numel() * size)
            save_file(shard, str(out / fname), metadata={"format": "pt"})
            total += sum(t.numel() * size for t in shard.values())
            weight_map.update(dict.fromkeys(names, fname))
            del shard
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1) + "\n")
    cfg = dict(cfg, torch_dtype=str(dtype).removeprefix("torch."))
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def write_drafter(cfg: dict, target_hidden: int, out: Path, dtype: torch.dtype) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    weights = random_drafter_weights(cfg, target_hidden, seed=0, dtype=dtype)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(dict(cfg, torch_dtype=str(dtype).removeprefix("torch."),
                                                     dflash_trained=False), indent=2) + "\n")
    return out


def write_random_pair(model: str, out: Path, *, dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
                      smoke: bool = False, shard_bytes: int = SHARD_BYTES) -> tuple[Path, Path]:
    if model not in KNOWN_MODELS:
        raise DFlashError("--model", f"{model!r} is not a known model",
                          "use one of " + ", ".join(sorted(KNOWN_MODELS)))
    tcfg, dcfg = target_config(model, smoke=smoke), drafter_config(model, smoke=smoke)
    target = write_target(tcfg, out / "target", dtype, device, shard_bytes)
    return target, write_drafter(dcfg, tcfg["hidden_size"], out / "drafter", dtype)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-8b", help="a known model's shapes (dflash-build's --target names)")
    p.add_argument("--out", type=Path, required=True, help="folder for target/ and drafter/ (must not hold them yet)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where the random draws run (a GPU draws 16 GB in seconds; the files are the same)")
    p.add_argument("--smoke", action="store_true", help="tiny widths and depths, same architecture (a CPU check)")
    args = p.parse_args(argv)
    taken = [d for d in (args.out / "target", args.out / "drafter") if d.exists()]
    if taken:
        raise DFlashError("--out", f"{taken[0]} exists", "pass an empty folder, or remove it first")
    # written beside, renamed when whole: a run stopped half-way leaves no folder that looks like a checkpoint
    partial = args.out / ".random_pair.partial"
    shutil.rmtree(partial, ignore_errors=True)
    target, drafter = write_random_pair(args.model, partial, dtype=getattr(torch, args.dtype), device=args.device,
                                        smoke=args.smoke)
    target.rename(args.out / "target")
    drafter.rename(args.out / "drafter")
    partial.rmdir()
    print(f"random {args.model}{' (smoke)' if args.smoke else ''}: {args.out / 'target'} and {args.out / 'drafter'}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
