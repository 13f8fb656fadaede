# SPDX-License-Identifier: Apache-2.0
"""Run under `mpiexec -n N`: what one DFlash step and one AR step launch per decoder layer (layer_counts.py), on
the Triton kernels in Triton's CPU interpreter, at TP 1 (rank 0, alone, before the group forms) and on every rank
of TP N, with the tokens each step committed. Each rank writes OUT_DIR/tp<N>_rank<r>.json, rank 0 also OUT_DIR/tp1.json.

usage: tp_kernel_counts_run.py TARGET DRAFTER OUT_DIR TP_SIZE [KERNELS,...]

KERNELS: RuntimeConfig.kernels of each TP rank (default triton on all); the test gives one rank "torch" to see
the comparison fail.
"""
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: the kernels run on the CPU

from tests.runtime.layer_counts import LayerCounts  # noqa: E402
from trtllm_dflash.config import RuntimeConfig, SamplingParams  # noqa: E402
from trtllm_dflash.errors import exit_code  # noqa: E402
from trtllm_dflash.runtime.distributed import launcher_rank_and_size  # noqa: E402
from trtllm_dflash.runtime.engine import Engine  # noqa: E402

PROMPT = [5, 9, 14, 3, 22]


def record(target, drafter, tp_size: int, kernels: str):
    """(engine, {"counts": {step: counts}, "tokens": {step: [samples, accepted]}}) after a prefill of PROMPT, then
    one DFlash step and one AR step (sampled), every rank calling the runner in the same order (no follower loop:
    nothing but the step is counted). Each rank's tokens are its own: nothing broadcasts them after sampling."""
    # the CPU even where a GPU is visible: the interpreter runs the kernels on CPU tensors, the ranks talk over gloo
    cfg = RuntimeConfig(max_seq_len=64, max_batch_size=1, dtype="float32", device="cpu", kernels=kernels,
                        cuda_graphs=False)
    eng = Engine.from_dirs(target, drafter, cfg, tp_size=tp_size)
    runner = eng.runner
    runner.admit(0, SamplingParams(max_new_tokens=16, temperature=0.8, seed=3, ignore_eos=True))
    runner.prefill([(0, 0, len(PROMPT))], {0: PROMPT})
    counts, out = LayerCounts(eng), {"counts": {}, "tokens": {}}
    with counts.installed():
        for step, block in (("dflash", eng.block_size), ("ar", 1)):
            with counts.counting():
                out["tokens"][step] = runner.decode(1, block)
            out["counts"][step] = counts.as_dict()
    return eng, out


def main(argv) -> int:
    target, drafter, out_dir, tp = argv[0], argv[1], Path(argv[2]), int(argv[3])
    rank, _ = launcher_rank_and_size()
    settings = argv[4].split(",") if len(argv) > 4 else ["triton"] * tp
    if rank == 0:
        _, ref = record(target, drafter, 1, "triton")
        (out_dir / "tp1.json").write_text(json.dumps(ref))
    eng, got = record(target, drafter, tp, settings[rank])
    (out_dir / f"tp{tp}_rank{rank}.json").write_text(json.dumps(got))
    eng.tp.close()
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, sys.argv[1:]))
