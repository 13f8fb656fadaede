# SPDX-License-Identifier: Apache-2.0
"""Where a dflash-train step's time goes: the real training step (ModelOpt DFlash model, our fused KD loss and
per-sample anchors, bf16 autocast, AdamW) on synthetic batches of the lengths the regenerated data has, timed by
phase with CUDA events, and the top kernels from torch.profiler.

Phases of one optimizer step, training.loop.train_step itself (hooks on the model, the target trunk, the draft module
and the optimizer mark the boundaries):

  target     the frozen target's forward (all its layers, hidden states of the tapped ones, the logits the KD
             loss distils);
  prepare    anchors, the draft's noise embeddings, positions and its [batch, 1, anchors x block, ctx + anchors x
             block] attention mask;
  draft      the draft module's forward;
  loss       the rest of the forward: the KD loss (fused: lm_head per row chunk, and the gradient w.r.t. the draft's
             hidden states in the same pass);
  backward   the loss's finiteness check, back-propagation through the draft, gradient clipping;
  optimizer  AdamW.

Tokens/s counts supervised response tokens, as dflash-train's batch probe and loss.csv do. Lengths are drawn per
sequence from [x/2, 3x/2] of ``--prompt_tokens`` / ``--response_tokens`` (responses capped at ``--max_new_tokens``);
the token ids are random (the step's cost does not depend on them).

  python -m trtllm_dflash.bench.train_step --out /tmp/train_step.json            # one GPU, SmolLM2, ~1 min
  python -m trtllm_dflash.bench.train_step --plot before=A.json after=B.json --out phases.png   # stacked phases
  python -m trtllm_dflash.bench.train_step --target DIR --device cpu --batch 2 --steps 2 --num_layers 2 \\
      --block_size 8 --num_anchors 8 --prompt_tokens 16 --response_tokens 16 --out /tmp/t.json   # CPU smoke
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from pathlib import Path

import torch

PHASES = ("target", "prepare", "draft", "loss", "backward", "optimizer")


def synthetic(n: int, vocab: int, avoid: int, prompt: int, response: int, cap: int, seed: int) -> list:
    """``n`` training examples of random ids (never ``avoid``, the mask id) with lengths drawn around the means."""
    from trtllm_dflash.training.batches import Example

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = rng.randint(max(1, prompt // 2), max(1, prompt * 3 // 2))
        r = min(cap, rng.randint(max(2, response // 2), max(2, response * 3 // 2)))
        ids = [rng.randrange(vocab - 1) for _ in range(p + r)]
        ids = [i + 1 if i >= avoid else i for i in ids]
        out.append(Example(tuple(ids), (0,) * p + (1,) * r))
    return out


class PhaseClock:
    """CUDA events (perf_counter on the CPU) at a training step's boundaries, from hooks: the whole model's
    forward, the target trunk's, the draft module's, and the optimizer's step."""

    def __init__(self, model, opt, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: dict[str, object] = {}
        trunk, draft = model.get_submodule(model.base_model_prefix), model.dflash_module
        self.handles = [model.register_forward_pre_hook(lambda *a: self.mark("start")),
                        trunk.register_forward_pre_hook(lambda *a: self.mark("target_start")),
                        trunk.register_forward_hook(lambda *a: self.mark("target_end")),
                        draft.register_forward_pre_hook(lambda *a: self.mark("draft_start")),
                        draft.register_forward_hook(lambda *a: self.mark("draft_end")),
                        model.register_forward_hook(lambda *a: self.mark("forward_end")),
                        opt.register_step_pre_hook(lambda *a: self.mark("backward_end")),
                        opt.register_step_post_hook(lambda *a: self.mark("end"))]

    def mark(self, name: str) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks[name] = e
        else:
            self.marks[name] = time.perf_counter()

    def _ms(self, a: str, b: str) -> float:
        x, y = self.marks[a], self.marks[b]
        return x.elapsed_time(y) if self.cuda else (y - x) * 1e3

    def phases(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        order = ("start", "target_start", "target_end", "draft_start", "draft_end", "forward_end", "backward_end",
                 "end")
        ms = [self._ms(a, b) for a, b in zip(order, order[1:])]
        # the forward's few ops before the target (inputs to the device dtype, masks) count as prepare
        return {"target": ms[1], "prepare": ms[0] + ms[2], "draft": ms[3], "loss": ms[4], "backward": ms[5],
                "optimizer": ms[6]}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def top_kernels(prof, steps: int, limit: int, cuda: bool) -> list[dict]:
    """The ops with the most self time (on CUDA: the kernels' GPU time), in ms per step."""
    rows = []
    for e in prof.key_averages():
        t = e.self_device_time_total if cuda else e.self_cpu_time_total
        if t and e.key and not e.key.startswith("ProfilerStep"):
            rows.append({"name": e.key[:160], "ms_per_step": round(t / 1e3 / steps, 3),
                         "calls_per_step": round(e.count / steps, 1)})
    rows.sort(key=lambda r: -r["ms_per_step"])
    return rows[:limit]


def device_busy_ms(prof, steps: int) -> float:
    """Kernel time per step, all kernels summed: far below the step time means the GPU waits on the host."""
    from torch.autograd import DeviceType
    total = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == DeviceType.CUDA)
    return round(total / 1e3 / steps, 2)


def measure(model, opt, params, autocast, clock: PhaseClock, device, batch: int, vocab: int, args) -> dict:
    """Warm-up, timed steps by phase, and (--profile) the top kernels of two more steps at one batch size."""
    from trtllm_dflash.training.batches import BatchStream
    from trtllm_dflash.training.loop import train_step

    def step(i: int, b: dict | None = None) -> int:   # the supervised tokens of step i's batch
        return train_step(model, opt, params, b or to_dev(i), 1.0, autocast, i)["tokens"]

    data = synthetic(batch * (args.steps + 4), vocab, args.mask_token_id, args.prompt_tokens,
                     args.response_tokens, args.max_new_tokens, seed=batch)
    stream = BatchStream(data, batch, args.block_size, seed=0, pad_multiple=args.pad_multiple)
    to_dev = (lambda i: {k: v if k == "sample_ids" else v.to(device, non_blocking=True)
                         for k, v in stream.batch(i).items()})
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(2):
        step(i)
    sums, tokens, lengths = dict.fromkeys(PHASES, 0.0), 0, []
    t0, cpu0 = time.perf_counter(), time.process_time()
    for i in range(2, 2 + args.steps):
        b = to_dev(i)
        lengths.append(int(b["input_ids"].shape[1]))
        tokens += step(i, b)
        for k, v in clock.phases().items():   # synchronizes: the wall clock below includes the host gaps
            sums[k] += v
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    row = {"batch": batch, "steps": args.steps, "s_per_step": round(wall / args.steps, 4),
           "tokens_per_s": round(tokens / wall, 1), "tokens_per_step": round(tokens / args.steps),
           "padded_len_mean": round(sum(lengths) / len(lengths), 1), "distinct_lengths": len(set(lengths)),
           "host_cpu_s_per_step": round(cpu / args.steps, 4),
           "phase_ms": {k: round(v / args.steps, 2) for k, v in sums.items()}}
    row["phase_sum_ms"] = round(sum(row["phase_ms"].values()), 2)
    row["host_gap_ms"] = round(row["s_per_step"] * 1e3 - row["phase_sum_ms"], 2)
    if device.type == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            for i in range(2 + args.steps, 4 + args.steps):
                step(i)
            if device.type == "cuda":
                torch.cuda.synchronize()
        row["top_kernels"] = top_kernels(prof, 2, args.top, device.type == "cuda")
        if device.type == "cuda":
            row["device_busy_ms"] = device_busy_ms(prof, 2)
    return row


def plot_phases(runs: dict[str, dict], out: Path) -> None:
    """One stacked bar per (run, batch): the phases' ms per step, tokens/s above the bar."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{label}\nbatch {r['batch']}", r) for label, d in runs.items() for r in d["rows"] if "phase_ms" in r]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(bars), 4.2))
    bottom = [0.0] * len(bars)
    for phase in PHASES:
        vals = [r["phase_ms"][phase] for _, r in bars]
        ax.bar(range(len(bars)), vals, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, (_, r) in enumerate(bars):
        ax.text(i, bottom[i], f"{r['tokens_per_s'] / 1e3:.1f}k tok/s", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(bars)), [name for name, _ in bars], fontsize=8)
    ax.set_ylabel("ms per optimizer step")
    devices = sorted({d.get("device", "?") for d in runs.values()})
    ax.set_title(f"dflash-train step by phase ({', '.join(devices)})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.bench.train_step",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m", help="smollm2-135m (packaged) or an HF checkpoint folder")
    p.add_argument("--init_drafter", default=None,
                   help="start from this exported drafter (its shape); default: random weights of the flags' shape")
    p.add_argument("--batch", default="64", help="per-GPU batch sizes to time, comma list")
    p.add_argument("--steps", type=int, default=8, help="timed steps per batch size (after 2 warm-up steps)")
    p.add_argument("--num_layers", type=int, default=3)
    p.add_argument("--block_size", type=int, default=16)
    p.add_argument("--num_anchors", type=int, default=128)
    p.add_argument("--target_layer_ids", type=int, nargs="+", default=None,
                   help="target layers the draft taps (default: the z-lab rule, as dflash-train)")
    p.add_argument("--mask_token_id", type=int, default=16, help="SmolLM2's <empty_output> (the shipped drafter's)")
    p.add_argument("--kd_impl", choices=("fused", "modelopt"), default="fused")
    p.add_argument("--prompt_tokens", type=int, default=180, help="mean prompt length (tokens, chat template included)")
    p.add_argument("--response_tokens", type=int, default=282,
                   help="mean response length (the v4 data: 54.9 M tokens over 194,475 answers)")
    p.add_argument("--max_new_tokens", type=int, default=384, help="response cap, as the regeneration's")
    p.add_argument("--pad_multiple", type=int, default=None,
                   help="pad each batch to a multiple of this many tokens (default: the block size, as dflash-train)")
    p.add_argument("--sdpa", choices=("default", "no_cudnn"), default="default",
                   help="no_cudnn: turn PyTorch's cuDNN attention backend off (flash / memory-efficient instead)")
    p.add_argument("--profile", action="store_true", help="torch.profiler over 2 more steps: the top kernels")
    p.add_argument("--top", type=int, default=25, help="kernels listed with --profile")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--plot", nargs="+", metavar="LABEL=JSON", default=None,
                   help="draw earlier results (stacked phases per batch) into --out (.png) instead of measuring")
    p.add_argument("--out", type=Path, required=True, help="results JSON (with --plot: the PNG)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.plot:
        runs = {}
        for item in args.plot:
            label, _, path = item.rpartition("=")
            runs[label or Path(path).stem] = json.loads(Path(path).read_text())
        plot_phases(runs, args.out)
        print(f"wrote {args.out}")
        return 0
    from trtllm_dflash.checkpoints import hf
    from trtllm_dflash.provenance import record
    from trtllm_dflash.training import anchors, modelopt_model
    from trtllm_dflash.training.loop import autocast_for
    from trtllm_dflash.training.settings import TrainConfig
    from trtllm_dflash.training.target import resolve_target

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    target_dir = resolve_target(args.target)
    cfg = TrainConfig(target=args.target, data="synthetic", out="/nonexistent", num_layers=args.num_layers,
                      block_size=args.block_size, num_anchors=args.num_anchors, kd_impl=args.kd_impl,
                      init_drafter=args.init_drafter, max_seq_len=4096,
                      target_layer_ids=tuple(args.target_layer_ids) if args.target_layer_ids else None)
    torch.manual_seed(0)
    if args.sdpa == "no_cudnn":
        torch.backends.cuda.enable_cudnn_sdp(False)
    model, mo_cfg = modelopt_model.build(cfg, target_dir, args.mask_token_id, device)
    anchors.install(model)
    params = modelopt_model.trainable(model)
    opt = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0)
    autocast = autocast_for(device)
    vocab = hf.read_config(target_dir)["vocab_size"]
    sizes = [int(b) for b in args.batch.split(",")]
    out = {"benchmark": "train_step",
           "provenance": record(checkpoints={"target": target_dir,
                                             "init_drafter": modelopt_model.init_drafter_dir(args.init_drafter)
                                             if args.init_drafter else None}),
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"out": str(args.out)},
           "draft_parameters": sum(p.numel() for p in model.dflash_module.parameters()), "rows": []}
    clock = PhaseClock(model, opt, device)
    model.train()
    for batch in sizes:
        try:
            row = measure(model, opt, params, autocast, clock, device, batch, vocab, args)
        except torch.cuda.OutOfMemoryError:
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            row = {"batch": batch, "error": "out of memory"}
        out["rows"].append(row)
        print(f"train_step: batch {batch}: " + (row.get("error") or f"{row['s_per_step'] * 1e3:.0f} ms/step, "
              f"{row['tokens_per_s']:.0f} tok/s, phases {row['phase_ms']}"), flush=True)
    clock.remove()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
