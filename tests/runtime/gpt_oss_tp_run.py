# SPDX-License-Identifier: Apache-2.0
"""Run under `mpiexec -n N`: a gpt-oss target + drafter with tp_size N and ep_size E generate fixed prompts
(greedy and sampled, longer than the sliding window); rank 0 writes the tokens as JSON.

usage: gpt_oss_tp_run.py TARGET DRAFTER OUT.json TP_SIZE EP_SIZE
"""
import json
import sys

from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.errors import exit_code
from trtllm_dflash.runtime.engine import Engine

PROMPTS = [[5, 9, 13], [7, 3] * 12, list(range(40, 70))]
PARAMS = [SamplingParams(max_new_tokens=20, ignore_eos=True),
          SamplingParams(max_new_tokens=20, ignore_eos=True, temperature=1.0, seed=3),
          SamplingParams(max_new_tokens=20, ignore_eos=True)]


def run(target, drafter, tp_size: int, ep_size: int = 1):
    eng = Engine.from_dirs(target, drafter, RuntimeConfig(max_seq_len=128, max_batch_size=2), tp_size=tp_size,
                           ep_size=ep_size)
    if eng.tp.rank != 0:
        eng.follow()
        return None
    out = [r.output_ids for r in eng.generate(PROMPTS, PARAMS)]
    eng.shutdown()
    return out


def main(argv) -> int:
    target, drafter, out_path, tp, ep = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    tokens = run(target, drafter, tp, ep)
    if tokens is not None:
        with open(out_path, "w") as f:
            json.dump({"tokens": tokens}, f)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, sys.argv[1:]))  # as the console scripts leave a TP job
