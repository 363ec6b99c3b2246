"""Makes ``dist.init_process_group("xagg")`` work without ``import xagg.torch``, so a script
changes only its backend name. Run at interpreter start by the package's ``xagg_torch_backend.pth``; it
imports nothing itself: when a program imports ``torch.distributed``, its
``init_process_group`` and ``new_group`` are wrapped so that the first call naming the
``"xagg"`` backend imports ``xagg.torch`` (which registers it) before going on."""

import importlib.abc
import importlib.util
import sys


def _wrap(dist):
    def lazily(f):
        def call(*args, **kwargs):
            backend = kwargs.get("backend", args[0] if args else None)
            if str(backend).lower() == "xagg" and "xagg.torch" not in sys.modules:
                import xagg.torch  # noqa: F401 - registers the backend

            return f(*args, **kwargs)

        call.__wrapped__ = f
        call.__name__ = f.__name__
        call.__doc__ = f.__doc__
        return call

    for name in ("init_process_group", "new_group"):
        f = getattr(dist, name, None)
        if f is not None and not hasattr(f, "__wrapped__"):
            setattr(dist, name, lazily(f))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hooks the loading of torch.distributed."""

    def find_spec(self, name, path, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            pass
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _wrap(module)

        spec.loader.exec_module = exec_module
        return spec


def install():
    if "torch.distributed" in sys.modules:
        _wrap(sys.modules["torch.distributed"])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
