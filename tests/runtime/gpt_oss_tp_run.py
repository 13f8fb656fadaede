# SPDX-License-Identifier: Apache-2.0
"""Run under `mpiexec -n N`: tp_run.py with a gpt-oss pair, prompts longer than the sliding window, greedy and
sampled; rank 0 writes the tokens as JSON.

usage: gpt_oss_tp_run.py TARGET DRAFTER OUT.json TP_SIZE EP_SIZE
"""
import sys

from tests.runtime import tp_run
from trtllm_dflash.config import SamplingParams
from trtllm_dflash.errors import exit_code

PROMPTS = [[5, 9, 13], [7, 3] * 12, list(range(40, 70))]
PARAMS = [SamplingParams(max_new_tokens=20, ignore_eos=True),
          SamplingParams(max_new_tokens=20, ignore_eos=True, temperature=1.0, seed=3),
          SamplingParams(max_new_tokens=20, ignore_eos=True)]


def run(target, drafter, tp_size: int, ep_size: int = 1):
    return tp_run.run(target, drafter, tp_size, ep_size=ep_size, prompts=PROMPTS, params=PARAMS)


if __name__ == "__main__":
    sys.exit(exit_code(lambda argv: tp_run.main(argv, key="tokens", prompts=PROMPTS, params=PARAMS), sys.argv[1:]))
