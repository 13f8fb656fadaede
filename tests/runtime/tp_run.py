# SPDX-License-Identifier: Apache-2.0
"""Run under `mpiexec -n N`: load a pair with tp_size N (and ep_size E), generate fixed prompts, rank 0 writes JSON.

usage: tp_run.py TARGET DRAFTER OUT.json TP_SIZE [EP_SIZE]
"""
import json
import sys

from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.errors import exit_code
from trtllm_dflash.runtime.engine import Engine

PROMPTS = [[5, 9, 13], [7] * 20, [40, 41, 42, 43, 44, 45, 46]]
PARAMS = [SamplingParams(max_new_tokens=24, ignore_eos=True),
          SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=1.0, seed=3),
          SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=0.8, top_k=10, seed=5)]


def run(target, drafter, tp_size, block_size=None, ep_size=1, prompts=PROMPTS, params=PARAMS, dtype="auto"):
    """Rank 0's tokens (None on the other ranks). The group stays open: the ranks part in exit_code, once rank 0
    has written (errors.leave_job), as the console scripts' do."""
    eng = Engine.from_dirs(target, drafter, RuntimeConfig(max_seq_len=128, max_batch_size=2, block_size=block_size,
                                                          dtype=dtype), tp_size=tp_size, ep_size=ep_size)
    # every step's schedule travels over the host (gloo) group init_tp made beside the default one
    assert tp_size == 1 or eng.tp.host is not None, "no host group: the steps would go over the default group"
    if eng.tp.rank != 0:
        eng.follow(close=False)
        return None
    out = [r.output_ids for r in eng.generate(prompts, params)]
    eng.shutdown(close=False)
    return out


def main(argv, key="dflash", **workload) -> int:
    target, drafter, out_path, tp = argv[0], argv[1], argv[2], int(argv[3])
    tokens = run(target, drafter, tp, ep_size=int(argv[4]) if len(argv) > 4 else 1, **workload)
    if tokens is not None:
        with open(out_path, "w") as f:
            json.dump({key: tokens}, f)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, sys.argv[1:]))  # as the console scripts leave a TP job
