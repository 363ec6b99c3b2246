"""Allreduce through an in-network aggregation switch.

A process is one member (rank) of a job that its ranks join over the network::

    import numpy as np, xagg
    job = xagg.from_env()            # or xagg.Job.join(daemon=..., rank=..., size=..., key=..., secret=...)
    grads = np.ones(1 << 20, np.float32)
    job.allreduce(grads, "sum")      # in place, zero-copy; the GIL is released while it waits
    req = job.submit(grads, "max")   # or in flight, with others
    req.wait()

Arrays must be C-contiguous and writeable, of int32, uint32, int64, float16, float32 or
float64 (anything else raises, saying what to do). Failures raise ``xagg.XaggError``.

``xagg.torch`` registers a ``torch.distributed`` backend named ``"xagg"``.
"""

import os

from ._xagg import Job, Request, XaggError, new_key

__all__ = ["Job", "Request", "XaggError", "new_key", "from_env"]


def _first(*names):
    for n in names:
        v = os.environ.get(n)
        if v is not None:
            return v
    return None


def from_env(**kw):
    """Joins the job the environment describes.

    - ``XAGG_DAEMON``: the daemon's network listener, ``IP:PORT``;
    - ``XAGG_CREDENTIAL``: ``NAME:KEY``, to create the job (optional for the other ranks);
    - ``XAGG_JOB_KEY`` and ``XAGG_JOB_SECRET``: the job's key and secret (hex, from
      ``xagg.new_key()``, the same on every rank);
    - the rank and size from the launcher: ``RANK``/``WORLD_SIZE`` (torchrun),
      ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE`` (Open MPI), ``PMI_RANK``/``PMI_SIZE``;
    - where every host runs its own daemon (``XAGG_DAEMON`` then names this host's), which
      reduces its ranks before the switch: ``XAGG_COORDINATOR``, rank 0's host's daemon
      (it places the hosts in a ring should no switch take the job), and this host's ranks
      from the launcher: ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (torchrun),
      ``OMPI_COMM_WORLD_LOCAL_RANK``/``OMPI_COMM_WORLD_LOCAL_SIZE`` (Open MPI).

    Keyword arguments override them (``daemon``, ``rank``, ``size``, ``key``, ``secret``,
    ``credential``, ``slots``, ``timeout``, ``give_up``, ``local_rank``, ``local_size``,
    ``coordinator``, ``daemons``).
    """
    env = {
        "daemon": os.environ.get("XAGG_DAEMON"),
        "credential": os.environ.get("XAGG_CREDENTIAL"),
        "key": os.environ.get("XAGG_JOB_KEY"),
        "secret": os.environ.get("XAGG_JOB_SECRET"),
        "rank": _first("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"),
        "size": _first("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
    }
    coordinator = os.environ.get("XAGG_COORDINATOR")
    if coordinator is not None:
        env["coordinator"] = coordinator
        env["local_rank"] = _first("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")
        env["local_size"] = _first("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")
        if env["local_rank"] is None or env["local_size"] is None:
            raise XaggError(
                "XAGG_COORDINATOR is set but not this host's ranks: set LOCAL_RANK and LOCAL_WORLD_SIZE (torchrun and Open MPI set theirs)"
            )
        env["local_rank"] = int(env["local_rank"])
        env["local_size"] = int(env["local_size"])
    env.update(kw)
    missing = [k for k in ("daemon", "key", "secret", "rank", "size") if env.get(k) is None]
    if missing:
        raise XaggError(
            "the job is not fully described: missing "
            + ", ".join(missing)
            + " (set XAGG_DAEMON, XAGG_JOB_KEY, XAGG_JOB_SECRET and the launcher's RANK/WORLD_SIZE, or pass them)"
        )
    env["rank"] = int(env["rank"])
    env["size"] = int(env["size"])
    return Job.join(**env)
