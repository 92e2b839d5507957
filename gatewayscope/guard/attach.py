"""The guard for gateways gatewayscope does not start: every rLLM gateway app a process builds gets it.

rLLM's trainers start their gateway themselves (``GatewayManager``): a subprocess ``python -m
rllm_model_gateway ...``, or ``create_app(GatewayConfig(...))`` served by uvicorn on a thread of the trainer.
Both build the app with ``rllm_model_gateway.server.create_app``, looked up on the module when it runs. This
module replaces that function, in one process, with one that builds the same app around the tombstone guard
(:class:`~gatewayscope.guard.memory.GuardedTraceStore` over whatever store rLLM would build, the request
stamps and the ``/guard`` routes of :mod:`gatewayscope.guard.gateway`):

* :func:`attach` does it now, for code that builds the app itself (one call before the gateway starts);
* ``gatewayscope guard run -- COMMAND`` does it in COMMAND and every Python process it starts: it puts the
  directory of ``_autoattach/sitecustomize.py`` first on ``PYTHONPATH``; that file, run by Python at the start
  of each process, installs an import hook (standard library only) that calls :func:`patch_server_module` on
  ``rllm_model_gateway.server`` right after it is imported, and nothing else, so a process that never imports
  the gateway pays one small file at start-up.

It never breaks the gateway: where it cannot attach (a gateway whose ``create_app`` or store it does not know),
the gateway is built unguarded, exactly as rLLM builds it, and that is said once in the log. With a discovery
directory each guarded gateway announces itself there while it serves (:mod:`gatewayscope.guard.discovery`).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("gatewayscope.guard")

#: "1" in a process's environment: patch the rLLM gateway as it is imported (set by ``guard run``)
ENABLE_ENV = "GATEWAYSCOPE_GUARD_ATTACH"
#: the guard's ``max_tombstones`` (default 1,000,000; 0 disables the guard)
MAX_TOMBSTONES_ENV = "GATEWAYSCOPE_GUARD_MAX_TOMBSTONES"
#: where each guarded gateway announces itself (Prometheus file_sd JSON)
DISCOVERY_DIR_ENV = "GATEWAYSCOPE_GUARD_DISCOVERY_DIR"
#: the attribute that marks a patched ``create_app`` and holds rLLM's own
UNGUARDED = "__gatewayscope_unguarded__"

_said: set[str] = set()


def _say_once(key: str, message: str, *args: Any) -> None:
    if key not in _said:
        _said.add(key)
        logger.warning(message, *args)


def options_from_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> tuple[int, str | None]:
    """(max_tombstones, discovery_dir) from the environment ``guard run`` sets; a malformed number means the
    default, said once."""
    from gatewayscope.guard.memory import DEFAULT_MAX_TOMBSTONES

    raw = environ.get(MAX_TOMBSTONES_ENV, "")
    max_tombstones = DEFAULT_MAX_TOMBSTONES
    if raw.strip():
        try:
            max_tombstones = int(raw)
            if max_tombstones < 0:
                raise ValueError(raw)
        except ValueError:
            max_tombstones = DEFAULT_MAX_TOMBSTONES
            _say_once("max", "gatewayscope guard: %s=%r is not a whole number >= 0; using %d", MAX_TOMBSTONES_ENV,
                      raw, DEFAULT_MAX_TOMBSTONES)
    return max_tombstones, environ.get(DISCOVERY_DIR_ENV) or None


def guarded_create_app(original: Callable[..., Any], *, max_tombstones: int,
                       discovery_dir: str | None = None) -> Callable[..., Any]:
    """A ``create_app`` that builds rLLM's app (``original``) around the guard, with the same parameters."""
    try:
        signature: inspect.Signature | None = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original)
    def create_app(*args: Any, **kwargs: Any) -> Any:
        from gatewayscope.guard.memory import GuardedTraceStore

        if signature is None or "store" not in signature.parameters or "config" not in signature.parameters:
            _say_once("signature", "gatewayscope guard: this rllm-model-gateway's create_app has no config and "
                                   "store parameters; the gateway runs UNGUARDED")
            return original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # rLLM raises the caller's own error
        config, store = bound.arguments.get("config"), bound.arguments.get("store")
        if isinstance(store, GuardedTraceStore) or max_tombstones == 0:
            return original(*args, **kwargs)  # already guarded (gatewayscope gateway), or the guard is off
        try:
            from gatewayscope.guard.gateway import guarded_store

            config, guard = guarded_store(config, store, max_tombstones=max_tombstones)
        except Exception as err:  # an rLLM this guard does not know: serve rLLM's own app, and say so
            _say_once("store", "gatewayscope guard: cannot guard this rllm-model-gateway (%s); the gateway runs "
                               "UNGUARDED", err)
            return original(*args, **kwargs)
        bound.arguments["config"], bound.arguments["store"] = config, guard
        app = original(*bound.args, **bound.kwargs)
        try:
            from gatewayscope.guard.gateway import guard_app

            guard_app(app, guard, announce_to=discovery_dir, config=config)
        except Exception as err:
            _say_once("app", "gatewayscope guard: the guard's routes could not be added (%s); the store is guarded, "
                             "its state is not served", err)
        logger.info("gatewayscope tombstone guard attached: up to %d tombstones", max_tombstones)
        return app

    setattr(create_app, UNGUARDED, original)
    return create_app


def patch_server_module(module: Any, *, max_tombstones: int | None = None, discovery_dir: str | None = None) -> bool:
    """Replace ``module.create_app`` (``rllm_model_gateway.server``) with the guarded one; True when it did
    (False: already patched, or nothing to patch, said once). Options default to the environment's."""
    original = getattr(module, "create_app", None)
    if original is None or not callable(original):
        _say_once("missing", "gatewayscope guard: rllm_model_gateway.server has no create_app; the gateway runs "
                             "UNGUARDED")
        return False
    if hasattr(original, UNGUARDED):
        return False
    env_max, env_dir = options_from_env()
    module.create_app = guarded_create_app(
        original, max_tombstones=env_max if max_tombstones is None else max_tombstones,
        discovery_dir=env_dir if discovery_dir is None else discovery_dir)
    return True


def attach(*, max_tombstones: int | None = None, discovery_dir: str | None = None) -> bool:
    """Give every rLLM gateway app this process builds from now on the tombstone guard (one call, before the
    trainer starts its gateway): ``rllm_model_gateway.server.create_app`` is replaced by one that builds rLLM's
    own app around the guard. ``max_tombstones`` (default 1,000,000; 0: no guard) and ``discovery_dir`` (where
    each gateway announces itself) default to the environment ``guard run`` sets. Returns True when it
    patched now, False when it had already (a second call changes nothing).

    Code that imported the function by name before (``from rllm_model_gateway.server import create_app`` at
    module level) keeps rLLM's; rLLM's ``GatewayManager`` imports it when it starts the gateway.
    """
    from gatewayscope.guard.gateway import require_gateway

    require_gateway()
    import rllm_model_gateway.server as server

    return patch_server_module(server, max_tombstones=max_tombstones, discovery_dir=discovery_dir)
