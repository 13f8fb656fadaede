# SPDX-License-Identifier: Apache-2.0
"""Correctness of the torch runtime on CUDA (CUDA graphs on), in one run on the GPU host:

1. tiny random Llama / Qwen3 pairs in float32: DFlash greedy == AR greedy == HF transformers greedy, and
   DFlash sampled == AR sampled (same seed), with several requests of different lengths in one batch;
2. the real SmolLM2-135M-Instruct target (from the packaged GGUF) in bf16: DFlash greedy vs the runtime's own
   AR greedy, prompt by prompt, and the tokens/s seen at batch 1 and 8.

    python benchmarks/cuda_check.py --out results.json [--smollm2]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm_dflash.config import RuntimeConfig, SamplingParams  # noqa: E402
from trtllm_dflash.runtime.engine import Engine  # noqa: E402

PROMPTS = ["What is the capital of France?", "Write a Python function that returns the sum of a list.",
           "Explain speculative decoding in two sentences.", "List three prime numbers greater than 100.",
           "Translate 'good morning' into Spanish and German.", "What does a GPU do?",
           "Write a haiku about the sea.", "How many legs does a spider have?"]


def tiny_checks(dtype: str) -> list[dict]:
    from transformers import AutoModelForCausalLM

    from tests.tiny import write_tiny_pair
    out = []
    for arch in ("llama", "qwen3"):
        with tempfile.TemporaryDirectory() as d:
            target, drafter = write_tiny_pair(Path(d), arch)
            cfg = dict(max_seq_len=256, max_batch_size=4, dtype=dtype, device="cuda")
            ar = Engine.from_dirs(target, None, RuntimeConfig(block_size=1, **cfg))
            df = Engine.from_dirs(target, drafter, RuntimeConfig(**cfg))
            g = torch.Generator().manual_seed(0)
            prompts = [torch.randint(2, 90, (k,), generator=g).tolist() for k in (3, 17, 1, 40, 9, 25)]
            greedy = SamplingParams(max_new_tokens=48, ignore_eos=True)
            a, b = ar.generate(prompts, greedy), df.generate(prompts, greedy)
            hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).cuda()
            hf_same = sum(
                hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=48, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(p):].tolist() == x.output_ids for p, x in zip(prompts, a))
            sps = [SamplingParams(max_new_tokens=48, ignore_eos=True, temperature=1.0, top_k=20, seed=s) for s in range(6)]
            sa, sd = ar.generate(prompts, sps), df.generate(prompts, sps)
            out.append({"arch": arch, "dtype": dtype, "n": len(prompts),
                        "dflash_eq_ar_greedy": sum(x.output_ids == y.output_ids for x, y in zip(a, b)),
                        "ar_eq_hf_greedy": hf_same,
                        "dflash_eq_ar_sampled": sum(x.output_ids == y.output_ids for x, y in zip(sa, sd)),
                        "graphs": df.counters.get("graphs", 0)})
            print(out[-1], flush=True)
    return out


def smollm2_check() -> dict:
    from trtllm_dflash.checkpoints.drafter_init import write_random_drafter
    from trtllm_dflash.checkpoints.packaged import smollm2_target_dir
    target = smollm2_target_dir()
    res = {}
    with tempfile.TemporaryDirectory() as d:
        drafter = write_random_drafter(target, Path(d) / "drafter", num_layers=1, block_size=16)
        cfg = dict(max_seq_len=1024, max_batch_size=8, dtype="bfloat16", device="cuda")
        ar = Engine.from_dirs(target, None, RuntimeConfig(block_size=1, **cfg))
        df = Engine.from_dirs(target, drafter, RuntimeConfig(**cfg))
        tok = ar.tokenizer
        prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=False) for p in PROMPTS]
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        sp = SamplingParams(max_new_tokens=128)
        for eng in (ar, df):  # warm up: graph capture for the shapes used below
            eng.generate(ids[:1], sp), eng.generate(ids, sp)
        for name, eng in (("ar", ar), ("dflash", df)):
            for batch in (1, 8):
                t0 = time.perf_counter()
                reqs = eng.generate(ids[:batch], SamplingParams(max_new_tokens=128, ignore_eos=True))
                wall = time.perf_counter() - t0
                res[f"{name}_b{batch}_tok_per_s"] = sum(len(r.output_ids) for r in reqs) / wall
        a, b = ar.generate(ids, sp), df.generate(ids, sp)
        res.update(n_prompts=len(ids), dflash_eq_ar_greedy=sum(x.output_ids == y.output_ids for x, y in zip(a, b)),
                   first_answer=tok.decode(a[0].output_ids, skip_special_tokens=True),
                   tau_untrained=sum(r.stats.tau for r in b) / len(b))
        res["diverged_at"] = [next((i for i, (u, v) in enumerate(zip(x.output_ids, y.output_ids)) if u != v), None)
                              for x, y in zip(a, b)]
    print(res, flush=True)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--smollm2", action="store_true")
    p.add_argument("--skip_tiny", action="store_true")
    args = p.parse_args(argv)
    import transformers
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__}
    if not args.skip_tiny:
        res["tiny"] = tiny_checks("float32") + tiny_checks("bfloat16")
    if args.smollm2:
        res["smollm2"] = smollm2_check()
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
