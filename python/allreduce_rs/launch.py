"""Starts the ranks of a job on this host: ``python -m allreduce_rs.launch -n 4 -- python train.py ...``.

Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, ALLREDUCE_JOB_ID, and MASTER_ADDR / MASTER_PORT
unless they are set (so torch.distributed's env:// rendezvous works too); output lines are prefixed with the rank;
the first rank that fails stops the others, and the launcher exits 1 naming it. It is the project's launcher
(``comm-bench launch``), built into the package.
"""

import argparse
import sys
from typing import List, Mapping, Optional, Sequence

from . import _native
from .errors import AllreduceError


def run(
    world: int,
    argv: Sequence[str],
    env: Optional[Mapping[str, str]] = None,
    prefix_output: bool = True,
) -> None:
    """Runs ``argv`` as the ``world`` ranks of a fresh job and waits for them; raises LauncherError (``rank``: the
    first that failed) when one fails, after stopping the others."""
    _native.launch(world, list(argv), list((env or {}).items()), prefix_output)


def main(args: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m allreduce_rs.launch",
        description="Run a command as the ranks of a job on this host.",
    )
    parser.add_argument("-n", "--num_ranks", "--nproc-per-node", type=int, required=True, help="ranks to start")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments (after --)")
    opts = parser.parse_args(args)
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if not command:
        parser.error("no command given: python -m allreduce_rs.launch -n N -- program args...")
    try:
        run(opts.num_ranks, command)
    except AllreduceError as e:
        print(f"allreduce_rs.launch: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
