"""An ordinary mpi4py program: Comm.Allreduce on NumPy buffers of each type the switch
serves, in place and not, checked against local values. Rank 0 prints
"checks=C failures=F"."""
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
n = 10007
checks = failures = 0


def member(r, dtype):
    i = np.arange(n)
    return (((r * 7 + i * 13) % 17) - 8).astype(dtype)


for dtype in [np.int32, np.uint32, np.int64, np.float32, np.float64]:
    for op, reduce in [(MPI.SUM, np.add), (MPI.MIN, np.minimum), (MPI.MAX, np.maximum)]:
        want = member(0, dtype)
        for r in range(1, size):
            want = reduce(want, member(r, dtype))
        out = np.empty(n, dtype)
        comm.Allreduce(member(rank, dtype), out, op=op)
        checks += 1
        failures += not np.array_equal(out, want)
        buf = member(rank, dtype)
        comm.Allreduce(MPI.IN_PLACE, buf, op=op)
        checks += 1
        failures += not np.array_equal(buf, want)

failures = comm.reduce(failures, op=MPI.SUM, root=0)
if rank == 0:
    print(f"checks={checks} failures={failures}", flush=True)
    sys.exit(1 if failures else 0)
