# SPDX-License-Identifier: Apache-2.0
"""The weighted mean of drafters of one lineage, written as a drafter of its own (a "model soup": Wortsman et
al., ICML 2022, average the weights of models fine-tuned from one start).

A drafter continued from another (``dflash-train --init_drafter``) on a different mix of answers can gain on one
dataset and lose on another; their mean often keeps most of both gains at no training cost. Evaluate it like any
drafter (``python -m trtllm_dflash.bench.acceptance``): averaging never touches correctness (DFlash verifies every
token), only acceptance.

  python -m trtllm_dflash.training.average --drafters smollm2-135m-dflash runs/v7/drafter --out runs/soup

The drafters must share config.json (but for the fields below that do not shape the weights) and every tensor's
name, shape and dtype; the mean is taken in float64 and cast back. The output folder is new: config.json (whose
``dflash_training`` lists the sources, their weights, sha256 and training records) and one model.safetensors; it
appears whole or not at all.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from ..bench.helpformat import HelpFormatter
from ..checkpoints.hf import check_new_folder, load_state_dict, read_config, weight_digests, write_new_folder
from ..checkpoints.manifest import sha256_file
from ..checkpoints.resolve import resolve
from ..errors import DFlashError, exit_code

# config.json fields that record how a file was written or trained, not what the weights are
IGNORED_CONFIG = frozenset({"_name_or_path", "transformers_version", "torch_dtype", "dtype", "dflash_training"})


def _weights(given: list[float] | None, n: int) -> list[float]:
    if given is None:
        return [1.0 / n] * n
    if len(given) != n:
        raise DFlashError("--weights", f"{len(given)} weights for {n} drafters", "give one weight per drafter")
    if any(not math.isfinite(w) or w < 0 for w in given):
        raise DFlashError("--weights", f"{given} has a negative or non-finite weight", "give weights >= 0")
    if abs(sum(given) - 1.0) > 1e-6:
        raise DFlashError("--weights", f"{given} sum to {sum(given):g}", "give weights that sum to 1")
    return list(given)


def _same_config(configs: list[dict], names: list[str]) -> None:
    first = {k: v for k, v in configs[0].items() if k not in IGNORED_CONFIG}
    for cfg, name in zip(configs[1:], names[1:]):
        other = {k: v for k, v in cfg.items() if k not in IGNORED_CONFIG}
        for key in sorted(set(first) | set(other)):
            if first.get(key) != other.get(key):
                raise DFlashError(f"{name}/config.json", f"{key} is {_short(other.get(key))}, {names[0]} has "
                                  f"{_short(first.get(key))}", "average drafters of one shape (one continued from the other)")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def average_state_dicts(sds: list[dict[str, torch.Tensor]], weights: list[float],
                        names: list[str]) -> dict[str, torch.Tensor]:
    """sum_i weights[i] * sds[i], in float64, each tensor cast back to its dtype."""
    keys = set(sds[0])
    for sd, name in zip(sds[1:], names[1:]):
        if set(sd) != keys:
            diff = sorted(keys ^ set(sd))
            raise DFlashError(name, f"holds other tensors than {names[0]} (first difference: {diff[0]})",
                              "average drafters of one shape (one continued from the other)")
    out = {}
    for key in sorted(keys):
        ref = sds[0][key]
        for sd, name in zip(sds[1:], names[1:]):
            if sd[key].shape != ref.shape or sd[key].dtype != ref.dtype:
                raise DFlashError(name, f"{key} is {tuple(sd[key].shape)} {sd[key].dtype}, {names[0]} has "
                                  f"{tuple(ref.shape)} {ref.dtype}", "average drafters of one shape")
        if not ref.is_floating_point():   # integer buffers (none in z-lab drafters today) must agree
            if any(not torch.equal(sd[key], ref) for sd in sds[1:]):
                raise DFlashError(names[1], f"{key} is an integer tensor that differs", "average drafters of one shape")
            out[key] = ref.clone()
            continue
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for sd, w in zip(sds, weights):
            acc += w * sd[key].to(torch.float64)
        out[key] = acc.to(ref.dtype)
    return out


def average(drafters: list[str], out: Path, weights: list[float] | None = None) -> dict:
    """Write the weighted mean of ``drafters`` (folders or shipped names) to the new folder ``out``."""
    if len(drafters) < 2:
        raise DFlashError("--drafters", f"{len(drafters)} given", "name two or more drafters to average")
    w = _weights(weights, len(drafters))
    out = Path(out)
    check_new_folder(out)
    dirs = [resolve(d, role="--drafters").path for d in drafters]
    configs = [read_config(d) for d in dirs]
    _same_config(configs, drafters)
    sds = [load_state_dict(d) for d in dirs]
    mean = average_state_dicts(sds, w, drafters)
    # the first drafter's config; its training record becomes the list of what was averaged, with their digests
    config = dict(configs[0])
    config["dflash_training"] = {"tool": "python -m trtllm_dflash.training.average", "averaged": [
        {"drafter": spec, "weight": wt, "files": weight_digests(d),
         "dflash_training": cfg.get("dflash_training")} for spec, wt, d, cfg in zip(drafters, w, dirs, configs)]}
    written = write_new_folder(out, config, mean)
    record = {**config["dflash_training"], "tensors": len(mean), "model.safetensors": sha256_file(written)}
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.training.average", description=__doc__.split("\n\n")[0],
                                epilog="examples:\n  python -m trtllm_dflash.training.average --drafters "
                                "smollm2-135m-dflash runs/v7/drafter --out runs/soup\n"
                                "  python -m trtllm_dflash.training.average --drafters A B C --weights 0.5 0.25 0.25 "
                                "--out runs/soup3",
                                formatter_class=HelpFormatter)
    p.add_argument("--drafters", nargs="+", required=True,
                   help="drafter folders (z-lab layout) or shipped names, of one shape")
    p.add_argument("--weights", nargs="+", type=float, help="one per drafter, >= 0, summing to 1 (default: equal)")
    p.add_argument("--out", required=True, help="a new folder for the averaged drafter")
    a = p.parse_args(argv)
    record = average(a.drafters, Path(a.out), a.weights)
    print(f"wrote {a.out}: {record['tensors']} tensors, model.safetensors sha256 {record['model.safetensors'][:12]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(exit_code(main))
