# SPDX-License-Identifier: Apache-2.0
"""Run under `mpiexec -n N`: tp_run.py with a gpt-oss pair, prompts longer than the sliding window, greedy and
sampled; rank 0 writes the tokens as JSON.

usage: gpt_oss_tp_run.py TARGET DRAFTER OUT.json TP_SIZE EP_SIZE
"""
import sys

from tests.runtime import tp_run
from trtllm_dflash.errors import exit_code
from trtllm_dflash.testing import GPT_OSS_TP_PARAMS, GPT_OSS_TP_PROMPTS

PROMPTS, PARAMS = GPT_OSS_TP_PROMPTS, GPT_OSS_TP_PARAMS


def run(target, drafter, tp_size: int, ep_size: int = 1):
    return tp_run.run(target, drafter, tp_size, ep_size=ep_size, prompts=PROMPTS, params=PARAMS)


if __name__ == "__main__":
    sys.exit(exit_code(lambda argv: tp_run.main(argv, key="tokens", prompts=PROMPTS, params=PARAMS), sys.argv[1:]))
