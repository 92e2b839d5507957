"""Command-line runner shared by ``gatewayscope emulate bifrost`` and
``python -m gatewayscope.sandbox.bifrost_emulator``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from gatewayscope._argtypes import checked_number
from gatewayscope.cli.common import non_negative_seconds
from gatewayscope.errors import ConfigError
from gatewayscope.sandbox.bifrost_emulator.seed import DEFAULT_LIVE_PORT, DEFAULT_RNG_SEED, SEED_NAMES, apply_seed
from gatewayscope.sandbox.bifrost_emulator.server import BifrostEmulator, EmulatorOptions
from gatewayscope.sandbox.bifrost_emulator.state import (
    DEFAULT_BASELINE_GOROUTINES,
    DEFAULT_BASELINE_MEMORY_BYTES,
    DEFAULT_STACK_BYTES_PER_GOROUTINE,
)

DEFAULT_PORT = 8080
DEFAULT_PASSWORD_ENV = "GATEWAYSCOPE_EMULATOR_PASSWORD"


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0 (a free one) to 65535."""
    return checked_number(text, int, lambda value: 0 <= value <= 65535, "expected a port number, not {text!r}",
                          "expected a port from 0 to 65535, not {text!r}")


def _whole(minimum: int) -> Any:
    """An argparse type: a whole number >= ``minimum``."""
    def parse(text: str) -> int:
        return checked_number(text, int, lambda value: value >= minimum, "expected a whole number, not {text!r}",
                              f"expected a whole number >= {minimum}, not {{text!r}}")
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The emulator's flags (the same for both entry points)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT,
                        help="port to listen on, 0 for a free one (default: %(default)s, the gateway's)")
    parser.add_argument("--seed", choices=SEED_NAMES, default="empty",
                        help="store to boot with: empty, small (a dozen records) or realistic "
                             "(hundreds of org-scoped custom records) (default: %(default)s)")
    parser.add_argument("--rng-seed", type=int, default=DEFAULT_RNG_SEED,
                        help="random seed of the realistic store (default: %(default)s)")
    parser.add_argument("--live-port", type=_port, default=DEFAULT_LIVE_PORT,
                        help="port named in the seeded live base URLs (default: %(default)s)")
    parser.add_argument("--auth-user", metavar="USER",
                        help="turn on the management API's Basic auth with this admin user")
    parser.add_argument("--auth-password-env", metavar="VAR", default=None,
                        help=f"environment variable holding the admin password (default: {DEFAULT_PASSWORD_ENV}); "
                             "a password is never taken on the command line")
    parser.add_argument("--dns-timeout", type=non_negative_seconds, default=5.0,
                        help="bound on the base-URL DNS lookup, seconds (default: %(default)s)")
    parser.add_argument("--model-discovery-delay", type=non_negative_seconds, default=0.0,
                        help="emulated upstream model listing after each write, seconds, ≤ 15 (default: 0)")
    parser.add_argument("--version-string", default="v2.2.4",
                        help="what GET /api/version answers (default: %(default)s)")
    parser.add_argument("--legacy-delete-404", action="store_true",
                        help="older builds: DELETE of an unknown provider answers 404")
    parser.add_argument("--legacy-secret-shape", action="store_true",
                        help="older builds: secrets as {value, env_var, from_env}")
    parser.add_argument("--no-metrics", action="store_true",
                        help="GET /metrics answers 404, as with the gateway's telemetry plugin off")
    parser.add_argument("--stack-bytes-per-goroutine", type=_whole(1), default=DEFAULT_STACK_BYTES_PER_GOROUTINE,
                        help="stack each goroutine holds, bytes (default: %(default)s)")
    parser.add_argument("--baseline-memory-bytes", type=_whole(0), default=DEFAULT_BASELINE_MEMORY_BYTES,
                        help="memory the process holds besides goroutine stacks, bytes (default: %(default)s)")
    parser.add_argument("--baseline-goroutines", type=_whole(0), default=DEFAULT_BASELINE_GOROUTINES,
                        help="goroutines the process runs besides the workers (default: %(default)s)")
    parser.add_argument("--memory-limit-bytes", type=_whole(1), default=None,
                        help="kill the process when its resident memory would exceed this (default: no limit)")
    parser.add_argument("--update-overlap", action="store_true",
                        help="a provider update runs the old and the new workers together for a moment "
                             "(default: the old workers retire first)")


def _auth_from_args(args: argparse.Namespace) -> tuple[str, str] | None:
    var = args.auth_password_env or DEFAULT_PASSWORD_ENV
    if not args.auth_user:
        if args.auth_password_env:
            raise ConfigError("--auth-password-env needs --auth-user")
        return None
    password = os.environ.get(var, "")
    if not password:
        raise ConfigError(f"--auth-user needs the admin password in the environment variable {var} "
                          "(it is never taken on the command line)")
    return args.auth_user, password


def _mib(value: int) -> str:
    return f"{value / (1024 * 1024):,.0f} MiB"


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C or SIGTERM; exit 0 on a clean stop."""
    auth = _auth_from_args(args)
    try:
        options = EmulatorOptions(legacy_delete_404=args.legacy_delete_404,
                                  legacy_secret_shape=args.legacy_secret_shape, dns_timeout=args.dns_timeout,
                                  version=args.version_string, model_discovery_delay=args.model_discovery_delay,
                                  metrics_enabled=not args.no_metrics,
                                  stack_bytes_per_goroutine=args.stack_bytes_per_goroutine,
                                  baseline_memory_bytes=args.baseline_memory_bytes,
                                  baseline_goroutines=args.baseline_goroutines,
                                  memory_limit_bytes=args.memory_limit_bytes, update_overlap=args.update_overlap)
        emulator = BifrostEmulator(args.host, args.port, auth=auth, options=options)
    except ValueError as err:
        raise ConfigError(f"{err}.") from None
    summary = apply_seed(emulator, args.seed, rng_seed=args.rng_seed, live_port=args.live_port)
    try:
        emulator.start()
    except OSError as err:
        sys.stderr.write(f"gatewayscope: the Bifrost emulator cannot listen on {args.host}:{args.port}: {err}\n")
        return 1
    stop = threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        def _on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()
        # Ctrl-C and SIGTERM both stop cleanly (also when SIGINT was inherited as ignored, e.g. `cmd &`)
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, _on_signal)
    try:
        seed_text = f"{summary.name}" + (f" (rng seed {summary.rng_seed})" if summary.rng_seed is not None else "")
        print(f"Bifrost management-API emulator (an emulator, not the real gateway) listening on {emulator.url}")
        print(f"  store: {seed_text}: {summary.records} records ({summary.standard} standard, {summary.custom} "
              f"custom incl. {summary.anthropic_lanes} __anthropic lanes, {summary.unknown} unbuildable), "
              f"{summary.dead_base_urls} dead base URLs")
        print(f"  parked workers: {summary.parked_workers:,} (boot stacks {_mib(summary.boot_memory_low_bytes)}"
              f" to {_mib(summary.boot_memory_high_bytes)})")
        runtime = emulator.runtime()
        limit = runtime["memory_limit_bytes"]
        print(f"  process: {runtime['goroutines']:,} goroutines, {_mib(runtime['resident_memory_bytes'])} resident, "
              f"memory limit {_mib(limit) if limit else 'none'}"
              + (f"; KILLED while it boots ({runtime['death_reason']})" if runtime["dead"] else ""))
        print(f"  metrics: {emulator.url + '/metrics' if options.metrics_enabled else 'off (404)'}")
        print(f"  auth: {'Basic, user ' + auth[0] if auth else 'off'}")
        print(f"  emulator control: {emulator.url}/_emulator/state")
        print("Press Ctrl-C to stop.", flush=True)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    finally:
        emulator.stop()
        for number, handler in previous.items():
            signal.signal(number, handler)
    print("Bifrost emulator stopped.", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gatewayscope.sandbox.bifrost_emulator``."""
    parser = argparse.ArgumentParser(prog="python -m gatewayscope.sandbox.bifrost_emulator",
                                     description="Run the Bifrost management-API emulator on loopback.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ConfigError as err:
        for problem in err.problems:
            sys.stderr.write(f"gatewayscope: {problem}\n")
        return 2
