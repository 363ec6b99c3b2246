"""The xagg module on every rank (one process per lab namespace, the job from the
environment): allreduce of NumPy arrays of each type in place, requests in flight
together, and the refusals (a non-contiguous, a read-only, an unsupported array). Prints
"checks=C failures=F" and exits 1 on a failure."""
import sys

import numpy as np

import xagg

job = xagg.from_env()
rank, size = job.rank, job.size
checks = failures = 0


def check(what, ok):
    global checks, failures
    checks += 1
    if not ok:
        failures += 1
        print(f"rank {rank}: {what} failed", file=sys.stderr)


def member(r, n, dtype):
    i = np.arange(n)
    return (((r * 7 + i * 13) % 17) - 8).astype(dtype)


n = 100_003
for dtype in [np.int32, np.uint32, np.int64, np.float16, np.float32, np.float64]:
    for op, reduce in [("sum", np.add), ("min", np.minimum), ("max", np.maximum)]:
        want = member(0, n, dtype)
        for r in range(1, size):
            want = reduce(want, member(r, n, dtype))
        a = member(rank, n, dtype)
        job.allreduce(a, op)
        check(f"{op} over {np.dtype(dtype).name}", np.array_equal(a, want))

# Several requests in flight, waited in reverse order.
arrays = [np.full(50_000 + k, rank + k, np.int64) for k in range(4)]
requests = [job.submit(a, "sum") for a in arrays]
for k in reversed(range(4)):
    requests[k].wait()
    check(f"request {k}", bool(np.all(arrays[k] == sum(r + k for r in range(size)))))

# The mean of float32 and the bitwise or of int32.
a = np.full(1000, float(rank), np.float32)
job.allreduce(a, "avg")
check("avg", bool(np.all(a == (size - 1) / 2)))
a = np.full(10, 1 << rank, np.int32)
job.allreduce(a, "or")
check("or", bool(np.all(a == (1 << size) - 1)))

# Refused clearly, before anything is sent (the same on every rank).
for what, bad, kind, words in [
    ("non-contiguous", np.zeros(100, np.float32)[::2], ValueError, "not contiguous"),
    ("read-only", np.frombuffer(bytes(400), np.float32), ValueError, "read-only"),
    ("int16", np.zeros(10, np.int16), TypeError, "int16"),
]:
    try:
        job.allreduce(bad, "sum")
        check(f"{what} refused", False)
    except kind as e:
        check(f"{what} refused clearly ({e})", words in str(e))
try:
    job.allreduce(np.zeros(4, np.float32), "prod")
    check("prod of floats refused", False)
except xagg.XaggError as e:
    check(f"prod of floats refused clearly ({e})", "not supported" in str(e))
    # It pickles (DDP hands a hook's exception across to its caller so).
    import pickle

    again = pickle.loads(pickle.dumps(e))
    check("XaggError pickled", type(again) is xagg.XaggError and str(again) == str(e))

path = job.path
job.leave()
print(f"rank {rank}: path {path}", flush=True)
print(f"rank {rank}: checks={checks} failures={failures}", flush=True)
sys.exit(1 if failures else 0)
