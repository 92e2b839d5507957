"""``gatewayscope gateway``: the rLLM model gateway with the tombstone guard, as a drop-in command.

Same flags and defaults as ``rllm-model-gateway`` (``--host --port --config --worker --db-path --store
--log-level``, with its ``RLLM_GATEWAY_*`` env vars and YAML config), plus ``--max-tombstones N``.
The rLLM gateway is imported only when the command runs, so ``gatewayscope --help`` works without it.
"""

from __future__ import annotations

import argparse
from typing import Any

from gatewayscope.guard import gateway as guarded_gateway


def register(subparsers: Any) -> None:
    """Add the ``gateway`` subcommand."""
    parser = subparsers.add_parser(
        "gateway",
        help="run the rLLM model gateway with the tombstone guard (drop-in for rllm-model-gateway)",
        description=(
            "Run the rLLM model gateway (rllm-model-gateway) with gatewayscope's tombstone guard: a trace "
            "write whose request reached the gateway before its session's latest delete (a straggler) is "
            "dropped instead of resurrecting the session as an orphan; a write that came after it (the next "
            "step's or a retry's use of the id) is kept. Same flags, defaults, env vars and YAML config as "
            "rllm-model-gateway, plus --max-tombstones and --discovery-dir. Adds GET /guard/status, "
            "POST /guard/tombstones, POST /guard/tombstones/check, DELETE /guard/tombstones/{session_id} and "
            "GET /metrics. For a gateway a trainer starts itself, use 'gatewayscope guard run'. Needs the "
            "gateway extra: pip install 'gatewayscope[gateway]'."
        ),
    )
    guarded_gateway.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve the guarded gateway until interrupted; errors raise the gatewayscope error family."""
    return guarded_gateway.serve(args)
