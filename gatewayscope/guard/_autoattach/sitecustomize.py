"""gatewayscope's tombstone guard for rLLM gateways started by programs gatewayscope does not own.

``gatewayscope guard run -- COMMAND`` puts this file's directory first on ``PYTHONPATH``, so Python runs it at the
start of COMMAND and of every Python process COMMAND starts (this is the ``sitecustomize`` hook of the standard
library's ``site`` module). With ``GATEWAYSCOPE_GUARD_ATTACH=1`` it adds an import hook that does nothing until
the process imports ``rllm_model_gateway.server``; right after that module runs, it hands it to
``gatewayscope.guard.attach.patch_server_module``, which gives every gateway app built from then on the guard.
It imports nothing of gatewayscope before that, and it never raises: a process that cannot be guarded runs as
it would without it. Then it runs the ``sitecustomize`` it shadows, if there is one further on the path.
"""

import os
import sys


class _GatewayscopeGuardHook:
    """A meta path finder answering only for ``rllm_model_gateway.server``: found as the other finders find it,
    patched right after it runs, before the importer gets it."""

    target = "rllm_model_gateway.server"

    def find_spec(self, name, path=None, target=None):
        if name != self.target:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)  # type: ignore[assignment]
        return spec


class _PatchingLoader:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        try:
            from gatewayscope.guard.attach import patch_server_module

            patch_server_module(module)
        except Exception as err:  # never break the gateway's import: it runs unguarded and says so
            sys.stderr.write(f"gatewayscope guard: not attached ({type(err).__name__}: {err}); the gateway runs "
                             "UNGUARDED\n")

    def __getattr__(self, name):
        return getattr(self.loader, name)


def _install():
    if os.environ.get("GATEWAYSCOPE_GUARD_ATTACH") != "1":
        return
    if not any(isinstance(finder, _GatewayscopeGuardHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _GatewayscopeGuardHook())


def _run_the_next_sitecustomize():
    """Run the ``sitecustomize`` further on ``sys.path`` that this one shadows (a distribution's, a user's)."""
    import importlib.machinery

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return
    module = type(sys)("sitecustomize")
    module.__file__ = spec.origin
    module.__spec__ = spec
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _install()
except Exception as err:
    sys.stderr.write(f"gatewayscope guard: the import hook could not be installed ({err})\n")
_run_the_next_sitecustomize()
