"""``gatewayscope export``: serve the targets' findings as Prometheus metrics.

A thin shell over :mod:`gatewayscope.exporter`: the targets and policy come from ``--config`` (or the
quick-look flags), the exporter's own settings from the file's ``[exporter]`` table, ``--listen``
overrides its ``listen``. ``--once`` prints one ``/metrics`` answer and exits (0 when every target
was up, 1 otherwise), without opening a port.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import Any

from gatewayscope._text import terminal_safe
from gatewayscope.cli.common import add_target_arguments, config_from_args
from gatewayscope.cli.heal import pass_line, print_pass
from gatewayscope.errors import GatewayscopeError
from gatewayscope.exporter.settings import DEFAULT_LISTEN, parse_exporter_settings, parse_listen


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export",
        help="serve the targets' findings as Prometheus metrics (/metrics, /probe?target=NAME)",
        description=(
            "Run the Prometheus exporter:\n"
            "  /metrics                the exporter's own metrics and every target's (label target)\n"
            "  /probe?target=NAME      one target (the multi-target pattern)\n"
            "  /exporter-metrics       the exporter's own metrics only\n"
            "  /                       a landing page listing the targets\n"
            "  /-/healthy, /-/ready    the liveness and readiness probes (OK; no basic auth)\n"
            "Each target is read at most once per [exporter] min_interval_seconds (default 15 s), within\n"
            "the scrape's deadline (X-Prometheus-Scrape-Timeout-Seconds minus a margin); a target that is\n"
            "down, slow or answers garbage gives gatewayscope_up 0 and never fails the scrape. TLS and\n"
            "basic auth are set in the [exporter] table of the config file, never on the command line."
        ),
        epilog=("Example: gatewayscope export --config gatewayscope.toml --listen 0.0.0.0:9465\n"
                "         gatewayscope export --trace-store http://127.0.0.1:9090 --once"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target_arguments(parser)
    parser.add_argument("--listen", metavar="HOST:PORT",
                        help=f"address to serve on (default: [exporter] listen, else {DEFAULT_LISTEN}; "
                             "use [::]:PORT or 0.0.0.0:PORT for every interface)")
    parser.add_argument("--once", action="store_true",
                        help="print one /metrics answer to stdout and exit (0 when every target is up, else 1); "
                             "with --heal, after one heal pass")
    parser.add_argument("--heal", action="store_true",
                        help="also run heal's loop (the config's [heal] table) in this process: one read of each "
                             "target serves both, /metrics adds the gatewayscope_heal_* metrics, and POST "
                             "/-/heal/pause and /-/heal/resume flip its kill switch (behind the exporter's basic auth)")
    parser.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from gatewayscope.errors import ConfigError
    from gatewayscope.exporter.server import Exporter, make_server, read_budget, render, wait_forever

    config = config_from_args(args)
    settings = parse_exporter_settings(config.exporter, config.source or "<config>")
    heal = None
    if args.heal:
        from gatewayscope.heal.loop import HealLoop
        from gatewayscope.heal.settings import parse_heal_settings

        if not config.source:
            raise ConfigError("--heal needs --config FILE with a [heal] table (heal never runs on flag targets).")
        heal_settings = parse_heal_settings(config.heal, config.source,
                                            policy_idle_seconds=config.policy.orphan_idle_seconds)
        heal = HealLoop(config, heal_settings, share_reads=True)
        heal.prepare()
    if args.listen is not None:
        try:
            parse_listen(args.listen)
        except ValueError as err:
            raise ConfigError(f"command line: --listen: {err}") from None
    if args.once:
        exporter = Exporter(config, settings, heal=heal)
        if heal is not None:
            if heal.shares_reads:
                heal.read = exporter.read_for_heal
            with heal.lock:
                sys.stderr.write(pass_line(heal.run_pass()) + "\n")
        registry = exporter.metrics_registry(read_budget(None, settings))
        body, _ = render(registry)
        sys.stdout.write(body.decode())
        counters = exporter.cache.counters()
        up = all(entry["last"] is not None and entry["last"].snapshot.up for entry in counters.values())
        return 0 if up else 1

    server = make_server(config, settings, listen=args.listen, heal=heal)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    names = ", ".join(t.name for t in config.targets)
    found = (f", and the guarded gateways announced in {settings.discovery_dir}" if settings.discovery_dir else "")
    sys.stderr.write(terminal_safe(
        f"gatewayscope exporter serving {server.url}/metrics and {server.url}/probe?target=NAME "
        f"for {len(config.targets)} target(s): {names}{found}; each read at most every "
        f"{settings.min_interval_seconds:g} s. Ctrl-C stops it.") + "\n"
    )
    sys.stderr.flush()
    healing = None
    if heal is not None:
        def run_heal() -> None:
            try:
                heal.run(stop, on_pass=print_pass)
            except GatewayscopeError as err:  # another heal holds the journal: say so, stop the exporter too
                sys.stderr.write(f"gatewayscope: {terminal_safe(str(err))}\n")
                stop.set()

        healing = threading.Thread(target=run_heal, name="gatewayscope-heal", daemon=True)
        healing.start()
    try:
        wait_forever(server, stop)
    finally:
        if healing is not None:
            stop.set()
            healing.join(timeout=60)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    sys.stderr.write("gatewayscope exporter stopped.\n")
    return 0
