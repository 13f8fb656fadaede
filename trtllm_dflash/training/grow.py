# SPDX-License-Identifier: Apache-2.0
"""A deeper drafter that starts out computing exactly what a trained shallower one does, so training can go on
with more layers instead of starting a deeper drafter from random weights.

Each new layer is a copy of an existing layer, placed right after it, with its attention output projection
(``o_proj``) and its MLP down projection (``down_proj``) set to zero: a pre-norm residual layer whose two branches
add zero is the identity. ModelOpt 0.47 trains one tapped target layer per draft layer, so a drafter made that way
also taps more target layers when it grows (by default the paper's spread for the new depth, which for SmolLM2's
30 layers keeps 1, 14, 27 and adds 8 and 20): the new taps' columns of ``fc`` are zero, so the context features
are the same sum. The grown drafter's drafts and acceptance are the original's; its logits are equal to the bit
when the taps stay, and up to float rounding of the longer ``fc`` product when they grow.
Training then moves the zeroed projections first (their gradients are the branches' outputs, which are not zero);
the copied projections give the new layer's queries, keys and MLP sensible activations from the first step
(zero-initialised residual branches: Goyal et al. 2017, "Accurate, large minibatch SGD", for the last norm of a
residual block; Bachlechner et al. 2020, "ReZero").

  python -m trtllm_dflash.training.grow --drafter smollm2-135m-dflash --num_layers 5 --out runs/v9x5
  dflash-train ... --num_layers 5 --init_drafter runs/v9x5

The output folder is new: config.json (``num_hidden_layers``, ``layer_types`` and the taps grown; ``dflash_training``
records the source drafter, its sha256 and training record, and which layer each new one copies) and one
model.safetensors; it appears whole or not at all.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

from ..bench.helpformat import HelpFormatter
from ..checkpoints.hf import check_new_folder, load_state_dict, read_config, weight_digests, write_new_folder
from ..checkpoints.manifest import sha256_file
from ..checkpoints.resolve import resolve
from ..errors import DFlashError, exit_code
from ..model_config import build_target_layer_ids

# the residual branches' last projections: zero makes a layer the identity
ZEROED = ("self_attn.o_proj.", "mlp.down_proj.")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def layer_plan(num_layers: int, new_layers: int, copy_of: list[int] | None) -> list[int | tuple[int]]:
    """The grown stack, one entry per layer: an old layer's index, or (i,) for a zero-output copy of layer i placed
    after it. By default the last ``new_layers`` old layers are copied once each (the deepest first when more copies
    than layers are asked for)."""
    if new_layers < 1:
        raise DFlashError("--num_layers", f"is not above the drafter's {num_layers} layers",
                          f"pass a depth above {num_layers}")
    if copy_of is None:
        copy_of = sorted((num_layers - 1 - k % num_layers for k in range(new_layers)))
    if len(copy_of) != new_layers:
        raise DFlashError("--copy_of", f"names {len(copy_of)} layer(s) for {new_layers} new one(s)",
                          "name one old layer per new layer, or omit it")
    bad = [i for i in copy_of if not 0 <= i < num_layers]
    if bad:
        raise DFlashError("--copy_of", f"names layer {bad[0]}, the drafter has layers 0..{num_layers - 1}",
                          "name existing layers")
    plan: list[int | tuple[int]] = []
    for i in range(num_layers):
        plan.append(i)
        plan.extend((i,) for _ in range(copy_of.count(i)))
    return plan


def source_layer(entry: int | tuple[int]) -> int:
    """The old layer a plan entry (layer_plan) takes its tensors from."""
    return entry[0] if isinstance(entry, tuple) else entry


def grown_taps(config: dict, old: list[int], num_layers: int, given: list[int] | None) -> list[int]:
    """The grown drafter's tapped target layers: ``given``, else the same taps when the drafter has more or fewer
    taps than layers, else (one tap per layer, ModelOpt's rule) the paper's spread for the new depth. Every old tap
    (``old``) must stay (its columns of fc keep their weights)."""
    if given is None:
        if len(old) != config["num_hidden_layers"]:
            return old
        n_target = config.get("num_target_layers")
        if not isinstance(n_target, int):
            raise DFlashError("--target_layer_ids", "is needed: the drafter's config.json has no num_target_layers",
                              f"pass {num_layers} ids that include {old}")
        given = build_target_layer_ids(n_target, num_layers)
        why = f"the paper's spread for {num_layers} layers is {given}"
    else:
        why = f"{given} is given"
    lost = [i for i in old if i not in given]
    if lost:
        raise DFlashError("--target_layer_ids", f"{why}, which drops the drafter's tap(s) {lost}",
                          f"pass {num_layers} ids that include {old}")
    if len(set(given)) != len(given) or list(given) != sorted(given):
        raise DFlashError("--target_layer_ids", f"{given} is not strictly increasing", "list distinct ids in order")
    return list(given)


def grow_fc(fc: torch.Tensor, old: list[int], new: list[int]) -> torch.Tensor:
    """fc [H, len(new) * H] from fc [H, len(old) * H]: each old tap's column block where that tap now sits, zeros
    for the new taps (the concatenation of tapped hidden states follows the ids' order)."""
    h = fc.shape[1] // len(old)
    out = fc.new_zeros(fc.shape[0], len(new) * h)
    for j, tap in enumerate(old):
        k = new.index(tap)
        out[:, k * h:(k + 1) * h] = fc[:, j * h:(j + 1) * h]
    return out


def grow_state_dict(sd: dict[str, torch.Tensor], plan: list[int | tuple[int]]) -> dict[str, torch.Tensor]:
    """The grown layers: layer k of the plan takes its source layer's tensors (zeros for a copy's ZEROED ones);
    the tensors outside the layers (fc, norms) stay as they are."""
    layers: dict[int, dict[str, torch.Tensor]] = {}
    out = {}
    for key, tensor in sd.items():
        m = _LAYER.match(key)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
        else:
            out[key] = tensor.clone()
    for k, src in enumerate(plan):
        copy = isinstance(src, tuple)
        for name, tensor in layers[source_layer(src)].items():
            zero = copy and name.startswith(ZEROED)
            out[f"layers.{k}.{name}"] = torch.zeros_like(tensor) if zero else tensor.clone()
    return out


def grow(drafter: str, out: Path, num_layers: int, copy_of: list[int] | None = None,
         target_layer_ids: list[int] | None = None) -> dict:
    """Write ``drafter`` (a folder or a shipped name) grown to ``num_layers`` layers to the new folder ``out``."""
    out = Path(out)
    check_new_folder(out)
    src = resolve(drafter, role="--drafter").path
    config = read_config(src)
    old = config.get("num_hidden_layers")
    if not isinstance(old, int) or old < 1:
        raise DFlashError(f"{drafter}/config.json", f"num_hidden_layers is {old!r}", "pass a DFlash drafter folder")
    plan = layer_plan(old, num_layers - old, copy_of)
    taps_old = list((config.get("dflash_config") or {}).get("target_layer_ids") or [])
    taps = grown_taps(config, taps_old, num_layers, target_layer_ids)
    sd = load_state_dict(src)
    found = {int(m.group(1)) for m in map(_LAYER.match, sd) if m}
    if found != set(range(old)):
        raise DFlashError(str(drafter), f"holds layers {sorted(found)}, its config.json says {old}",
                          "pass a drafter whose weights and config.json agree")
    grown = grow_state_dict(sd, plan)
    source_training = config.get("dflash_training")
    config = dict(config)
    if taps != taps_old:
        if "fc.weight" not in grown or grown["fc.weight"].shape[1] % len(taps_old):
            raise DFlashError(str(drafter), "has no fc.weight of len(target_layer_ids) x hidden columns",
                              "pass a DFlash drafter (z-lab layout)")
        grown["fc.weight"] = grow_fc(grown["fc.weight"], taps_old, taps)
        config["dflash_config"] = {**config["dflash_config"], "target_layer_ids": taps}
    config["num_hidden_layers"] = num_layers
    if isinstance(config.get("layer_types"), list):
        types = config["layer_types"]
        config["layer_types"] = [types[source_layer(s)] for s in plan]
    config["dflash_training"] = {
        "tool": "python -m trtllm_dflash.training.grow",
        "grown_from": {"drafter": drafter, "num_layers": old, "target_layer_ids": taps_old,
                       "files": weight_digests(src),
                       "dflash_training": source_training},
        "layers": [f"copy of {s[0]} (o_proj, down_proj zero)" if isinstance(s, tuple) else f"layer {s}"
                   for s in plan],
        "new_taps": [t for t in taps if t not in taps_old]}
    written = write_new_folder(out, config, grown)
    record = {"layers": config["dflash_training"]["layers"], "taps": taps, "tensors": len(grown),
              "model.safetensors": sha256_file(written)}
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.training.grow", description=__doc__.split("\n\n")[0],
                                epilog="examples:\n  python -m trtllm_dflash.training.grow --drafter "
                                "smollm2-135m-dflash --num_layers 5 --out runs/v9x5\n"
                                "  python -m trtllm_dflash.training.grow --drafter runs/v9/drafter --num_layers 4 "
                                "--copy_of 0 --out runs/v9x4",
                                formatter_class=HelpFormatter)
    p.add_argument("--drafter", required=True, help="a drafter folder (z-lab layout) or a shipped name")
    p.add_argument("--num_layers", type=int, required=True, help="the grown drafter's depth (above the drafter's)")
    p.add_argument("--copy_of", type=int, nargs="+",
                   help="the old layer each new layer copies (placed after it); default: the last layers, one each")
    p.add_argument("--target_layer_ids", type=int, nargs="+",
                   help="the grown drafter's tapped target layers, the old ones included (default: see above)")
    p.add_argument("--out", required=True, help="a new folder for the grown drafter")
    a = p.parse_args(argv)
    record = grow(a.drafter, Path(a.out), a.num_layers, a.copy_of, a.target_layer_ids)
    print(f"wrote {a.out}: {len(record['layers'])} layers ({'; '.join(record['layers'])}), target layers "
          f"{record['taps']}, "
          f"model.safetensors sha256 {record['model.safetensors'][:12]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(exit_code(main))
