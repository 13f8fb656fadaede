# SPDX-License-Identifier: Apache-2.0
"""Tensor-parallel ranks 1..N-1 of a server whose rank 0 lives in another process (the Triton model).

    TRTLLM_DFLASH_RANK_OFFSET=1 TRTLLM_DFLASH_WORLD_SIZE=N MASTER_ADDR=... MASTER_PORT=... \\
        mpiexec -n N-1 python -m trtllm_dflash.runtime.worker DEPLOYMENT_DIR

Each rank loads its shard of the deployment and mirrors rank 0's steps until rank 0 shuts down.
"""
from __future__ import annotations

import argparse
import sys

from ..errors import exit_code
from .engine import Engine


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.runtime.worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("deployment_dir", help="the dflash-build deployment directory rank 0 serves")
    args = p.parse_args(argv)
    engine = Engine.from_deployment(args.deployment_dir)
    if engine.tp.rank == 0:
        print("error: worker started as rank 0; set TRTLLM_DFLASH_RANK_OFFSET=1", file=sys.stderr)
        return 2
    engine.follow()
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
