# SPDX-License-Identifier: Apache-2.0
"""tests/runtime/tp_run.py in float32 (exact across TP sizes on CUDA), for a launcher such as torch.distributed.run.

usage: tp_run_cuda.py TARGET DRAFTER OUT.json TP_SIZE
"""
import sys

from tests.runtime import tp_run
from trtllm_dflash.errors import exit_code

if __name__ == "__main__":
    sys.exit(exit_code(lambda argv: tp_run.main(argv, dtype="float32"), sys.argv[1:]))
