# SPDX-License-Identifier: Apache-2.0
"""Torch ops per decoder layer on the CPU path, for this tree and a baseline commit, side by side.

    python -m trtllm_dflash.bench.layer_op_counts --baseline b33e189 --out benchmarks/results/layer_op_counts.json

Counts the aten ops that the CPU runs (TorchDispatchMode) in one forward of small random models (Qwen3-style
target, Llama target, the DFlash drafter, gpt-oss) built with 2 and 3 layers: ops per layer = count(3) -
count(2), the rest of the forward (embedding, RoPE tables, masks, final norm) = count(2) - 2 x per layer.
``data_ops`` leaves out views (no kernel on any device). These are CPU op counts, not CUDA kernels: on CUDA
each compiled chain of models/layers.py (norms, add+norm, q/k norm+RoPE, masked softmax, SiLU*up) is one
kernel, and a graph replay launches them without the host; the counts show what changed between two trees,
op for op, on the same inputs.
"""
from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # the checkout whose git history holds the baseline
NO_KERNEL = {"detach", "alias", "lift_fresh", "_to_copy_noop"}  # besides func.is_view

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
         "rope_theta": 10000.0, "max_position_embeddings": 512}
LLAMA = {**QWEN3, "architectures": ["LlamaForCausalLM"]}
DRAFTER = {**QWEN3, "architectures": ["DFlashDraftModel"], "block_size": 16, "mask_token_id": 3,
           "target_layer_ids": [0]}
GPT_OSS = {"architectures": ["GptOssForCausalLM"], "vocab_size": 128, "hidden_size": 64, "intermediate_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
           "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "sliding_window": 8, "max_position_embeddings": 512}
N, BLOCK, PREFILL, CTX = 2, 16, 16, 40   # requests, verify/draft block, prefill chunk, tokens already cached


def count_one(tree: str) -> dict:
    """Op counts of every case for the trtllm_dflash package under ``tree`` (run in a fresh process)."""
    sys.path.insert(0, tree)
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from trtllm_dflash.runtime.distributed import TPGroup
    from trtllm_dflash.runtime.kv_cache import KVCache
    from trtllm_dflash.runtime.models import dflash, gpt_oss, llama

    from trtllm_dflash.runtime.models import layers
    chain_code = layers._fused(lambda x: x).__code__   # the wrapper every compiled chain runs through

    class Count(TorchDispatchMode):
        """ops[(name, kind)]: kind "view" (no kernel), "chain" (inside a chain compiled on CUDA) or "op"."""

        def __init__(self):
            super().__init__()
            self.ops, self.depth = collections.Counter(), 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            kind = "view" if func.is_view or name in NO_KERNEL else "chain" if self.depth else "op"
            self.ops[name, kind] += 1
            return func(*args, **(kwargs or {}))

        def profile(self, frame, event, arg):
            if frame.f_code is chain_code and event in ("call", "return"):
                if event == "call" and not self.depth:
                    self.ops["<compiled chain>", "chains"] += 1
                self.depth += 1 if event == "call" else -1

    def counted(fn) -> collections.Counter:
        with torch.inference_mode(), Count() as c:
            sys.setprofile(c.profile)
            try:
                fn()
            finally:
                sys.setprofile(None)
        return c.ops

    def init(model):
        g = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.05 if p.is_floating_point() else p.data
        return model.eval()

    tp, S = TPGroup(0, 1), 128
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (N, BLOCK), generator=g)
    verify_pos = CTX + torch.arange(BLOCK)[None].expand(N, BLOCK)          # [N, BLOCK]
    prefill_pos = torch.arange(PREFILL)[None].expand(N, PREFILL)           # [N, PREFILL]
    rows, step_rows = torch.arange(N), slice(0, N)   # as the runner: slot ids in prefill, a slice in a step

    def target_cases(family, cfg, layers):
        c = family.config.from_hf({**cfg, "num_hidden_layers": layers})
        m = init(family.model(c, tp, S, (0,)) if not family.moe else family.model(c, tp, S, (0,), 1, "dequant"))
        L, H, D = m.kv_shape()
        cache = KVCache(L, N, H, S, D, torch.float32, torch.device("cpu"))
        return {"target_verify": counted(lambda: m(ids, verify_pos, cache, step_rows, CTX + BLOCK)),
                "target_prefill": counted(lambda: m(ids[:, :PREFILL], prefill_pos, cache, rows, None))}

    def drafter_cases(layers):
        c = dflash.DrafterConfig.from_hf({**DRAFTER, "num_hidden_layers": layers})
        m = init(dflash.DFlashDrafter(c, QWEN3["hidden_size"], tp, S))
        L, H, D = m.kv_shape()
        cache = KVCache(L, N, H, S, D, torch.float32, torch.device("cpu"))
        x = torch.randn(N, BLOCK, c.hidden_size, generator=g)
        feats = torch.randn(N, BLOCK, QWEN3["hidden_size"], generator=g)
        start = torch.full((N,), CTX)
        return {"drafter_block": counted(lambda: m(x, verify_pos, start, cache, step_rows, CTX + BLOCK)),
                "drafter_context": counted(lambda: m.append_context(feats, verify_pos, cache, step_rows))}

    from trtllm_dflash.runtime.models import TARGETS
    out = {}
    for name, make in (("qwen3", lambda k: target_cases(TARGETS["Qwen3ForCausalLM"], QWEN3, k)),
                       ("llama", lambda k: target_cases(TARGETS["LlamaForCausalLM"], LLAMA, k)),
                       ("dflash_drafter", drafter_cases),
                       ("gpt_oss", lambda k: target_cases(TARGETS["GptOssForCausalLM"], GPT_OSS, k))):
        two, three = make(2), make(3)
        for case in two:
            per_layer = three[case] - two[case]
            rest = two[case] - per_layer - per_layer
            assert not (two[case] - rest - per_layer - per_layer) and not (three[case] - two[case] - per_layer), \
                f"{name} {case}: the 3-layer forward is not the 2-layer one plus one layer"

            def totals(c):
                by = collections.Counter()
                for (_, kind), v in c.items():
                    by[kind] += v
                # CUDA estimate: one kernel per compiled chain, one per other data op, none for views
                return {"ops": by["view"] + by["chain"] + by["op"], "data_ops": by["chain"] + by["op"],
                        "cuda_kernels_estimate": by["chains"] + by["op"]}
            out[f"{name}.{case}"] = {"per_layer": totals(per_layer), "rest_of_forward": totals(rest),
                                     "per_layer_ops": {f"{op} ({kind})": v for (op, kind), v in sorted(per_layer.items())
                                                       if kind != "view"}}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Writes {provenance, baseline, cases: {model.case: {before, after, "
                                       "per_layer_data_ops_change}}}. CPU only, a few seconds.")
    p.add_argument("--baseline", help="git ref to compare with (extracted with git archive into a temp dir)")
    p.add_argument("--out", help="results JSON (else printed)")
    p.add_argument("--_tree", help=argparse.SUPPRESS)  # internal: count the package under this dir, print JSON
    args = p.parse_args(argv)
    if args._tree:
        print(json.dumps(count_one(args._tree)))
        return 0

    def run(tree: str) -> dict:
        # run_path, not `python FILE`: the script's own folder (this package's bench/) must not come first on sys.path
        run_file = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
        proc = subprocess.run([sys.executable, "-c", run_file, __file__, "--_tree", tree], capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"op count under {tree} failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout)

    after = run(str(ROOT))
    before, base_sha = None, None
    if args.baseline:
        base_sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.baseline], capture_output=True,
                                  text=True, check=True).stdout.strip()
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", base_sha, "trtllm_dflash"],
                                     capture_output=True, check=True).stdout
            tar = Path(tmp) / "tree.tar"
            tar.write_bytes(archive)
            with tarfile.open(tar) as t:
                t.extractall(tmp, filter="data")
            before = run(tmp)
    cases = {}
    for key, a in after.items():
        b = (before or {}).get(key)
        cases[key] = {"after": a, **({"before": b, "per_layer_change": {
            k: a["per_layer"][k] - b["per_layer"][k] for k in a["per_layer"]}} if b else {})}
    from trtllm_dflash.provenance import record
    prov = record()
    result = {"git_sha": prov["git_sha"], "provenance": prov, "what": "aten ops per decoder layer on the CPU path (TorchDispatchMode), "
              "not CUDA kernels; data_ops excludes views; cuda_kernels_estimate counts each chain that "
              "models/layers.py compiles on CUDA as one kernel (not measured on a GPU)", "baseline": base_sha,
              "shapes": {"requests": N, "block": BLOCK, "prefill_chunk": PREFILL, "cached_tokens": CTX},
              "cases": cases}
    text = json.dumps(result, indent=1) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    for key, c in cases.items():
        a, b = c["after"]["per_layer"], c.get("before", {}).get("per_layer")
        print(f"{key:32s} per layer: {a['data_ops']:3d} CPU data ops, ~{a['cuda_kernels_estimate']:3d} CUDA kernels"
              + (f"  (baseline {b['data_ops']}, ~{b['cuda_kernels_estimate']})" if b else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
