"""What a scan uses of one rLLM trace record, shared by the HTTP source and the guarded launcher.

:func:`trace_row` derives a CANDIDATE_TRACES_SCHEMA row from a whole trace record (the HTTP source reads
records through ``POST /traces/query``); the guarded launcher serves the same row for its candidates' traces
on ``POST /guard/index`` as a summary (:func:`trace_summary`), which the HTTP source turns back into the row
(:func:`summary_row`). One function derives the row on both sides, so a scan through the summaries and one
through the whole records agree. Standard library only: the launcher imports this at start-up.
"""

from __future__ import annotations

import json
import math
from typing import Any

from gatewayscope.orphan_rule import dispatched_at_of

#: the keys of one trace's summary on ``POST /guard/index``, in the order of the row after its session id
SUMMARY_FIELDS = ("trace_id", "timestamp", "weight_version", "prompt_tokens", "prompt_chars", "model",
                  "dispatched_at")
#: the keys an older launcher's summaries lack (each is None then)
OPTIONAL_SUMMARY_FIELDS = ("dispatched_at",)


def as_float(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number (not a bool), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def as_int(value: Any) -> int | None:
    """``value`` when it is a whole JSON number (not a bool), else None."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def prompt_chars(messages: Any, *, strict: bool = False) -> int | None:
    """Size of a prompt as the length of its minified JSON (the same measure the SQLite source uses).
    ``strict``: ValueError for a value strict JSON cannot hold (NaN, Infinity), as the gateway's own encoder."""
    if messages is None:
        return None
    return len(json.dumps(messages, separators=(",", ":"), ensure_ascii=False, allow_nan=not strict))


def trace_row(trace: dict[str, Any], *, strict: bool = False) -> tuple[Any, ...]:
    """One CANDIDATE_TRACES_SCHEMA row from a trace record (upstream's ``weight_version`` when present):
    (session_id, trace_id, timestamp, weight_version, prompt_tokens, prompt_chars, model, dispatched_at).
    ``strict``: see :func:`prompt_chars`."""
    prompt_ids = trace.get("prompt_token_ids")
    raw_counts = trace.get("token_counts")
    token_counts: dict[str, Any] = raw_counts if isinstance(raw_counts, dict) else {}
    prompt_tokens = len(prompt_ids) if isinstance(prompt_ids, list) and prompt_ids else as_int(
        token_counts.get("prompt"))
    weight = trace.get("weight_version")
    if weight is None and isinstance(trace.get("metadata"), dict):
        weight = trace["metadata"].get("weight_version")
    return (
        str(trace.get("session_id", "")),
        str(trace.get("trace_id", "")),
        as_float(trace.get("timestamp")),
        as_int(weight),
        prompt_tokens,
        prompt_chars(trace.get("messages"), strict=strict),
        trace.get("model") if isinstance(trace.get("model"), str) else None,
        dispatched_at_of(trace),
    )


def trace_summary(trace: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of a trace record the launcher serves (:data:`SUMMARY_FIELDS`, the row of :func:`trace_row`
    without its session id), or None when strict JSON cannot carry it (a timestamp that is not finite, messages
    that are not JSON): the scan then reads that session's records whole, as from any gateway."""
    try:
        row = trace_row(trace, strict=True)  # what the gateway's encoder refuses, it refuses to send whole too
    except (TypeError, ValueError, RecursionError):  # messages JSON cannot hold: the whole read says what it can
        return None
    if row[2] is not None and not math.isfinite(row[2]):
        return None
    return dict(zip(SUMMARY_FIELDS, row[1:], strict=True))


def summary_row(session_id: str, summary: Any) -> tuple[Any, ...] | None:
    """The CANDIDATE_TRACES_SCHEMA row of one served summary of ``session_id``'s trace, or None when it is not
    a summary (a missing key, a value of the wrong type): the caller says what is wrong.

    >>> summary_row("a:0", {"trace_id": "t", "timestamp": 5, "weight_version": None, "prompt_tokens": 3,
    ...                     "prompt_chars": 20, "model": "m", "dispatched_at": 4.5})
    ('a:0', 't', 5.0, None, 3, 20, 'm', 4.5)
    """
    if not isinstance(summary, dict) or not all(key in summary for key in SUMMARY_FIELDS
                                                if key not in OPTIONAL_SUMMARY_FIELDS):
        return None
    dispatched = summary.get("dispatched_at")
    if dispatched is not None and as_float(dispatched) is None:
        return None
    trace_id, timestamp = summary.get("trace_id"), summary.get("timestamp")
    model = summary.get("model")
    if not isinstance(trace_id, str) or not (timestamp is None or as_float(timestamp) is not None) \
            or not (model is None or isinstance(model, str)):
        return None
    counts = []
    for key in ("weight_version", "prompt_tokens", "prompt_chars"):
        value = summary.get(key)
        if value is not None and as_int(value) is None:
            return None
        counts.append(value)
    return (session_id, trace_id, as_float(timestamp), *counts, model, as_float(dispatched))
