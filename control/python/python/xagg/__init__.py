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

from ._xagg import Job, Request, Route, XaggError, new_key, segment_bytes

__all__ = ["Job", "Request", "Route", "XaggError", "new_key", "segment_bytes", "from_env"]


def from_env(**kw):
    """Joins the job the environment describes.

    - ``XAGG_DAEMON``: the daemon's network listener, ``IP:PORT``;
    - ``XAGG_CREDENTIAL`` (a credential's name) and ``XAGG_CREDENTIAL_FILE`` (the file
      holding its key), to create the job (optional for the other ranks);
      ``XAGG_CREDENTIAL=NAME:KEY`` alone is read too;
    - ``XAGG_JOB_KEY`` and ``XAGG_JOB_SECRET``: the job's key and secret (hex, from
      ``xagg.new_key()``, the same on every rank);
    - the rank and size from the launcher: ``RANK``/``WORLD_SIZE`` (torchrun),
      ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE`` (Open MPI), ``PMI_RANK``/``PMI_SIZE``;
    - ``XAGG_SLOTS`` (default 128), ``XAGG_JOIN_TIMEOUT_MS`` (how long the ranks wait for
      each other to join, default 30000) and ``XAGG_GIVE_UP_MS`` (how long an allreduce
      waits for the switch, default 10000); ``XAGG_TIMEOUT_S`` (how long an allreduce
      waits for slow ranks while the switch answers, default 1800); ``XAGG_FLOAT``
      (``fast``, the default, or ``exact``: how float sums travel);
    - where every host runs its own daemon (``XAGG_DAEMON`` then names this host's), which
      reduces its ranks before the switch: ``XAGG_COORDINATOR``, rank 0's host's daemon
      (it places the hosts in a ring should no switch take the job), and this host's ranks
      from the launcher: ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (torchrun),
      ``OMPI_COMM_WORLD_LOCAL_RANK``/``OMPI_COMM_WORLD_LOCAL_SIZE`` (Open MPI).

    Keyword arguments override them (``daemon``, ``rank``, ``size``, ``key``, ``secret``,
    ``credential``, ``slots``, ``timeout`` and ``give_up`` in seconds, ``local_rank``,
    ``local_size``, ``coordinator``, ``daemons``, ``segment``, ``float``). ``Job.from_env`` is
    the same.

    The job's segment is the longest the path carries (``xagg.segment_bytes()``: this
    rank's interface's MTU and its daemon's ports'); ranks whose paths differ pass the
    smallest of theirs as ``segment`` (the ``"xagg"`` backend does).
    """
    return Job.from_env(**kw)
