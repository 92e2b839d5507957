"""What every command shares: the arguments of commands that read targets, and the logging setup."""

from __future__ import annotations

import argparse
import logging
import math
import os

from gatewayscope._argtypes import checked_number
from gatewayscope._text import terminal_safe
from gatewayscope.config import Config, Policy, build_config, load_config

DEFAULT_CONFIG_ENV = "GATEWAYSCOPE_CONFIG"

def non_negative_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0 (``inf`` and ``nan`` are refused with a sentence)."""
    return checked_number(text, float, lambda value: math.isfinite(value) and value >= 0,
                          "expected a number of seconds, not {text!r}",
                          "expected a finite number of seconds >= 0, not {text!r}")


def positive_number(text: str) -> float:
    """An argparse type: a finite number > 0 (seconds, a rate; ``inf`` and ``nan`` are refused with a sentence)."""
    return checked_number(text, float, lambda value: math.isfinite(value) and value > 0,
                          "expected a number, not {text!r}", "expected a finite number > 0, not {text!r}")


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    return checked_number(text, int, lambda value: value >= 0, "expected a whole number >= 0, not {text!r}",
                          "expected a whole number >= 0, not {text!r}")


def add_policy_arguments(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """The orphan rule's thresholds as flags (``plan`` and ``apply`` take the same ones)."""
    group.add_argument("--orphan-idle-seconds", type=non_negative_seconds, metavar="SECONDS",
                       help="a one-trace session idle longer than this is a suspected orphan (default 7200)")
    group.add_argument("--max-weight-lag", type=non_negative_int, metavar="N",
                       help="allowed weight-version staleness before an idle session is suspect (default 2)")


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("targets and policy")
    group.add_argument("--config", metavar="FILE",
                       help=f"TOML file of [[targets]] and [policy] (default: ${DEFAULT_CONFIG_ENV} if set)")
    group.add_argument("--trace-store", action="append", default=[], metavar="URL|PATH",
                       help="an rLLM gateway URL or the path of its SQLite store (repeatable)")
    group.add_argument("--bifrost", action="append", default=[], metavar="URL",
                       help="a Bifrost management API URL, no auth (repeatable; use --config for auth)")
    group.add_argument("--timeout", type=positive_number, metavar="SECONDS",
                       help="seconds each request to a target may take in all, its answer included "
                            "(overrides timeout_seconds)")
    group.add_argument("--max-body-bytes", type=int, metavar="BYTES",
                       help="the largest answer read from any target (overrides max_body_bytes; default 512 MiB)")
    add_policy_arguments(group)


def config_from_args(args: argparse.Namespace, *, require_targets: bool = True) -> Config:
    path = args.config or os.environ.get(DEFAULT_CONFIG_ENV) or None
    if not require_targets and not (path or args.trace_store or args.bifrost):
        config = Config(targets=[], policy=Policy())
        if args.orphan_idle_seconds is not None:
            config.policy.orphan_idle_seconds = args.orphan_idle_seconds
        if args.max_weight_lag is not None:
            config.policy.max_weight_lag = args.max_weight_lag
        return config
    if not require_targets and path and not (args.trace_store or args.bifrost):
        return load_config(path)
    return build_config(
        path,
        trace_stores=args.trace_store,
        bifrost_urls=args.bifrost,
        timeout_seconds=args.timeout,
        max_body_bytes=args.max_body_bytes,
        orphan_idle_seconds=args.orphan_idle_seconds,
        max_weight_lag=args.max_weight_lag,
    )


class TerminalSafeLogRecord(logging.LogRecord):
    """A log record whose message shows control and bidi characters as escapes (see ``terminal_safe``).

    Log messages quote session ids, record names, request paths and gateway errors; escaping the message
    itself means no handler (the CLI's, ``logging.basicConfig``'s, a server's) can print one raw. The
    arguments stay as they were for handlers that read them.
    """

    def getMessage(self) -> str:
        return terminal_safe(super().getMessage())


def setup_logging() -> None:
    """Make every log record of this process a :class:`TerminalSafeLogRecord` (idempotent).

    Handlers, levels and formats are left alone: a command that logs configures them itself.
    """
    if logging.getLogRecordFactory() is logging.LogRecord:
        logging.setLogRecordFactory(TerminalSafeLogRecord)
