# SPDX-License-Identifier: Apache-2.0
"""The one error type users see: it names the field at fault and the fix."""


class DFlashError(ValueError):
    """A user-facing error. ``str(err)`` is one line: ``<field>: <problem>. Fix: <fix>``."""

    def __init__(self, field: str, problem: str, fix: str = ""):
        self.field, self.problem, self.fix = field, problem, fix
        msg = f"{field}: {problem}"
        super().__init__(f"{msg}. Fix: {fix}" if fix else msg)


def exit_code(main, argv=None) -> int:
    """Run a command's ``main(argv)``; a DFlashError becomes one line on stderr and exit code 2.

    A rank of a multi-process (mpirun) job leaves right here with that code (leave_job): torch.distributed's C++
    threads can abort the interpreter's own teardown ("terminate called without an active exception",
    seen about once in 20 runs with gloo), which mpirun would report as a failed job."""
    import sys
    try:
        rc = main(argv) or 0
    except DFlashError as err:
        print(f"error: {err}", file=sys.stderr)
        rc = 2
    if _is_rank_of_a_job():
        leave_job(rc)
    return rc


def leave_job(rc: int) -> None:
    """End this rank of a multi-process job with ``rc`` through os._exit, once every rank of a tensor-parallel
    group still open has got here. MPICH's hydra ends the whole job as soon as one rank leaves this way, and still
    exits 0: a follower leaving first cut off rank 0 while it wrote its results (the file missing or empty, now
    and then). So the output is flushed first, and ranks that succeeded wait for each other; a failed one leaves
    at once (the others may be stuck in a collective it never reaches, and ending the job is what it wants). The
    wait needs the group still open: a command that writes after its engine's shutdown passes ``close=False``
    there (and to the followers' ``follow``), as dflash-generate does."""
    import os
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    dist = sys.modules.get("torch.distributed")  # a command that never imported torch has no group to wait on
    if rc == 0 and dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()
    # a TP 1 run under mpirun used MPI (a barrier) but no rendezvous, which finalises it (init_tp): Open MPI's mpirun
    # reports a rank that leaves without MPI_Finalize as failed and exits 1, though the run succeeded
    mpi = sys.modules.get("mpi4py.MPI")
    if rc == 0 and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(rc)


def _is_rank_of_a_job() -> bool:
    import os
    sizes = [os.environ.get(v, "") for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE", "TRTLLM_DFLASH_WORLD_SIZE")]
    return any(s.isdigit() and int(s) > 1 for s in sizes)
