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
# Integer means, floored (toward negative infinity) from the exact sum, at the types' ends.
for dtype in [np.int32, np.uint32]:
    info = np.iinfo(dtype)
    i = np.arange(10_000, dtype=np.int64)
    ends = np.array([info.min, info.max, info.min + 1, info.max - 1], np.int64)
    of = lambda r: np.concatenate([(i * (r + 3) * 7919) % (int(info.max) - int(info.min) + 1) + int(info.min), ends])
    want = sum(of(r) for r in range(size)) // size
    a = of(rank).astype(dtype)
    job.allreduce(a, "avg")
    check(f"avg over {np.dtype(dtype).name}", np.array_equal(a.astype(np.int64), want))

# The route by size against Gloo takes the element type: float16 allreduces from 4 ranks
# go to the switch at every size, int32's from 4 MiB to Gloo.
for ranks, f16, i32 in [(2, False, False), (4, True, False), (8, True, False)]:
    r = xagg.Route(None, ranks)
    check(f"route of 64 MiB of f16 at {ranks}", r.takes(64 << 20, "allreduce", "f16") == f16)
    check(f"route of 64 MiB of i32 at {ranks}", r.takes(64 << 20, "allreduce", "i32") == i32)
    check(f"route of 1 MiB of f16 at {ranks}", r.takes(1 << 20, "allreduce", "f16"))
# Measured in the fast mode: in the exact one (4 bytes a float16 on the wire) as int32's.
check("route of 64 MiB of exact f16 at 4", not xagg.Route(None, 4, "exact").takes(64 << 20, "allreduce", "f16"))
for bad in [lambda: xagg.Route(None, 4).takes(1, "allreduce", "float16"), lambda: xagg.Route(None, 4, "exactly")]:
    try:
        bad()
        check("unknown name refused", False)
    except ValueError as e:
        check(f"unknown name refused clearly ({e})", "use one of" in str(e))

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
