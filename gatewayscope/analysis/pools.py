"""Bifrost provider records: parked workers, queue slots, boot memory and unreachable records.

Pure functions, frames in and frames out, no I/O and no clock. The rules, as the gateway and the
platform that provisions it keep them:

* a record parks ``concurrency`` worker goroutines from boot on, whether or not traffic arrives,
  and holds ``buffer_size`` queue slots; a record the gateway lists with ``provider_status``
  ``error`` has no worker pool (the core could not build it), so it parks none;
* a goroutine's stack costs 2 KiB (floor) to 8 KiB (typical after growth), so boot memory grows
  with the number of stored records, not with traffic;
* a record with ``custom_provider_config`` is custom, and so is the Anthropic lane of a built-in
  provider (a record whose name ends in ``__anthropic``): the platform sizes both with its custom
  pool; every other record is standard;
* an unreachable record is one whose base URL host does not resolve from where gatewayscope runs,
  or whose ``provider_status`` is ``error``.

:func:`bifrost_figures` puts every Bifrost finding (these plus posture drift) into the one JSON-able
dict the views show (:func:`bifrost_summary` computes the findings of a read first), and
:func:`bifrost_sentence` says in one sentence whether the gateway would survive a restart within its
memory limit. :mod:`gatewayscope.analysis.findings` runs these for every view.

A small records frame (``RECORDS_SCHEMA``) for the examples below:

>>> from gatewayscope.config import Policy
>>> from gatewayscope.snapshot import RECORDS_SCHEMA, frame_from_rows
>>> records = frame_from_rows([
...     ("openai", False, None, 512, 8192, None, "active", "f1"),
...     ("acme__vllm__llama", True, "openai", 1000, 5000, "http://gone.invalid/v1", "active", "f2"),
...     ("acme__openrouter__claude__anthropic", True, "anthropic", 64, 1024, None, "error", "f3"),
... ], RECORDS_SCHEMA)
>>> classified = classify_records(records, Policy())
>>> classified.select("name", "kind", "target_pool", "over_pool").rows()
[('openai', 'standard', 512, False), ('acme__vllm__llama', 'custom', 64, True), \
('acme__openrouter__claude__anthropic', 'custom', 64, False)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from gatewayscope.analysis.memory import BootMemory, boot_memory
from gatewayscope.analysis.posture import posture_drift
from gatewayscope.config import Policy
from gatewayscope.snapshot import BifrostData
from gatewayscope.sources.bifrost.dns import base_url_host  # the hosts the sources check

#: the two record kinds, in the order every per-kind output lists them
KINDS = ("standard", "custom")
#: a parked goroutine's stack: the floor the Go runtime starts it with
STACK_BYTES_LOW = 2 * 1024
#: a parked goroutine's stack: typical after growth
STACK_BYTES_HIGH = 8 * 1024
#: the suffix of the Anthropic-lane sibling record, sized with the custom pool
ANTHROPIC_LANE_SUFFIX = "__anthropic"
_MIB = 1024 * 1024

def classify_records(records: pl.DataFrame, policy: Policy) -> pl.DataFrame:
    """Add each record's kind, its target pool and queue, and what it parks now.

    New columns: ``kind`` ("standard"/"custom"), ``target_pool``, ``target_queue``
    (pool x ``policy.queue_per_worker``), ``over_pool`` (the stored concurrency is above the pool),
    ``parked_workers`` (= concurrency), ``queue_slots`` (= buffer_size), ``stack_bytes_low`` and
    ``stack_bytes_high`` (2 KiB and 8 KiB per parked worker). A record in ``provider_status``
    ``error`` has no pool in the gateway: it parks 0 workers and holds 0 queue slots (its stored
    concurrency still decides ``over_pool``).

    >>> from gatewayscope.snapshot import RECORDS_SCHEMA, frame_from_rows
    >>> row = ("acme__x", True, "openai", 1000, 5000, None, "active", "f")
    >>> records = frame_from_rows([row], RECORDS_SCHEMA)
    >>> row = classify_records(records, Policy(custom_pool=64, queue_per_worker=16)).row(0, named=True)
    >>> row["kind"], row["target_pool"], row["target_queue"], row["over_pool"]
    ('custom', 64, 1024, True)
    >>> row["parked_workers"], row["queue_slots"], row["stack_bytes_low"], row["stack_bytes_high"]
    (1000, 5000, 2048000, 8192000)
    """
    anthropic_lane = pl.col("name").str.ends_with(ANTHROPIC_LANE_SUFFIX).fill_null(False)
    is_custom = pl.col("is_custom").fill_null(False) | anthropic_lane
    has_pool = pl.col("provider_status").ne("error").fill_null(True)
    workers = pl.when(has_pool).then(pl.col("concurrency").fill_null(0).cast(pl.Int64)).otherwise(0)
    slots = pl.when(has_pool).then(pl.col("buffer_size").fill_null(0).cast(pl.Int64)).otherwise(0)
    return (
        records.with_columns(
            pl.when(is_custom).then(pl.lit("custom")).otherwise(pl.lit("standard")).alias("kind"),
            pl.when(is_custom)
            .then(pl.lit(policy.custom_pool, dtype=pl.Int64))
            .otherwise(pl.lit(policy.standard_pool, dtype=pl.Int64))
            .alias("target_pool"),
            workers.alias("parked_workers"),
            slots.alias("queue_slots"),
            (workers * STACK_BYTES_LOW).alias("stack_bytes_low"),
            (workers * STACK_BYTES_HIGH).alias("stack_bytes_high"),
        )
        .with_columns(
            (pl.col("target_pool") * policy.queue_per_worker).alias("target_queue"),
            (pl.col("concurrency").fill_null(0) > pl.col("target_pool")).alias("over_pool"),
        )
        .select(
            *records.columns, "kind", "target_pool", "target_queue", "over_pool", "parked_workers",
            "queue_slots", "stack_bytes_low", "stack_bytes_high",
        )
    )


def unreachable_records(records: pl.DataFrame, reachability: pl.DataFrame) -> pl.DataFrame:
    """The records gatewayscope judges unreachable, with a ``reason`` each.

    A record is unreachable when its base URL host does not resolve from where gatewayscope runs
    (per ``reachability``; a host that was not checked counts as reachable), or when the gateway
    reports its ``provider_status`` as ``error``. Columns: ``name``, ``base_url``, ``host``,
    ``provider_status``, ``reason``.

    >>> from gatewayscope.snapshot import REACHABILITY_SCHEMA, RECORDS_SCHEMA, frame_from_rows
    >>> records = frame_from_rows([
    ...     ("a", True, "openai", 64, 1024, "http://gone.invalid/v1", "active", "f"),
    ...     ("b", False, None, 512, 8192, None, "error", "f"),
    ...     ("c", True, "openai", 64, 1024, "http://up.example/v1", "active", "f"),
    ... ], RECORDS_SCHEMA)
    >>> reach = frame_from_rows([("gone.invalid", False, "no such host"), ("up.example", True, None)],
    ...                         REACHABILITY_SCHEMA)
    >>> unreachable_records(records, reach).select("name", "reason").rows()
    [('a', 'base URL host gone.invalid does not resolve: no such host'), ('b', 'provider_status is error')]
    """
    reach = reachability.select(
        pl.col("host"), pl.col("resolves").alias("_resolves"), pl.col("error").alias("_error")
    ).unique(subset="host", keep="first")
    # the host of each distinct base URL once (a listing repeats a few hundred over thousands of records)
    hosts = records.select(pl.col("base_url").unique().drop_nulls()).with_columns(
        base_url_host(pl.col("base_url")).alias("host")
    )
    joined = records.join(hosts, on="base_url", how="left", maintain_order="left").join(
        reach, on="host", how="left"
    )
    dns_failed = pl.col("_resolves").eq(False).fill_null(False)
    status_error = pl.col("provider_status").eq("error").fill_null(False)
    dns_reason = pl.concat_str(
        pl.lit("base URL host "), pl.col("host"), pl.lit(" does not resolve"),
        pl.when(pl.col("_error").is_not_null() & (pl.col("_error").str.len_chars() > 0))
        .then(pl.lit(": ") + pl.col("_error"))
        .otherwise(pl.lit("")),
    )
    reason = (
        pl.when(dns_failed & status_error)
        .then(dns_reason + pl.lit("; provider_status is error"))
        .when(dns_failed)
        .then(dns_reason)
        .otherwise(pl.lit("provider_status is error"))
    )
    return (
        joined.filter(dns_failed | status_error)
        .with_columns(reason.alias("reason"))
        .select("name", "base_url", "host", "provider_status", "reason")
    )


@dataclass(frozen=True)
class BootEstimate:
    """What the stored records need in goroutine stacks at boot, against the memory limit.

    ``survives_restart`` is judged conservatively: "yes" only when even the high bound fits
    within the limit, "no" when even the low bound exceeds it, "at risk" in between.
    ``records_to_limit_low``/``_high`` is the number of records at which the limit is crossed
    (first exceeded) at the current average per record, for each bound; ``None`` when there are
    no workers to average.
    """

    records: int
    parked_workers: int
    stack_bytes_low: int
    stack_bytes_high: int
    memory_limit_bytes: int
    survives_restart: str
    records_to_limit_low: int | None
    records_to_limit_high: int | None


def _records_to_limit(total_bytes: int, records: int, limit: int) -> int | None:
    """Smallest whole N with N x (total_bytes / records) > limit, in exact integer arithmetic."""
    if records <= 0 or total_bytes <= 0:
        return None
    return limit * records // total_bytes + 1


def boot_estimate(classified: pl.DataFrame, memory_limit_bytes: int) -> BootEstimate:
    """Worker stack memory at boot (low and high bound) against ``memory_limit_bytes``.

    A hundred custom records at the gateway's default 1,000 workers park 100,000 goroutines:
    about 195 to 781 MiB of stacks, so a 512 MiB gateway is at risk, and at 8 KiB per worker the
    limit is crossed at the 66th such record.

    >>> from gatewayscope.snapshot import RECORDS_SCHEMA, frame_from_rows
    >>> rows = [(f"org{i}__m", True, "openai", 1000, 5000, None, "active", "f") for i in range(100)]
    >>> classified = classify_records(frame_from_rows(rows, RECORDS_SCHEMA), Policy())
    >>> est = boot_estimate(classified, 512 * 1024 * 1024)
    >>> est.stack_bytes_low, est.stack_bytes_high, est.survives_restart
    (204800000, 819200000, 'at risk')
    >>> est.records_to_limit_low, est.records_to_limit_high
    (263, 66)
    """
    records = classified.height
    workers = int(classified["parked_workers"].sum() or 0) if records else 0
    low = int(classified["stack_bytes_low"].sum() or 0) if records else 0
    high = int(classified["stack_bytes_high"].sum() or 0) if records else 0
    if high <= memory_limit_bytes:
        verdict = "yes"
    elif low > memory_limit_bytes:
        verdict = "no"
    else:
        verdict = "at risk"
    return BootEstimate(
        records=records,
        parked_workers=workers,
        stack_bytes_low=low,
        stack_bytes_high=high,
        memory_limit_bytes=memory_limit_bytes,
        survives_restart=verdict,
        records_to_limit_low=_records_to_limit(low, records, memory_limit_bytes),
        records_to_limit_high=_records_to_limit(high, records, memory_limit_bytes),
    )


def per_kind(classified: pl.DataFrame) -> pl.DataFrame:
    """Records, parked workers, queue slots and records over pool, per kind.

    Columns: ``kind``, ``records``, ``parked_workers``, ``queue_slots``, ``over_pool`` (the number
    of records of that kind above their pool).

    Both kinds are always present, in the order standard, custom, with zeros where there are none.

    >>> from gatewayscope.snapshot import RECORDS_SCHEMA, frame_from_rows
    >>> records = frame_from_rows([("a__m", True, "openai", 1000, 5000, None, "active", "f")], RECORDS_SCHEMA)
    >>> per_kind(classify_records(records, Policy())).rows()
    [('standard', 0, 0, 0, 0), ('custom', 1, 1000, 5000, 1)]
    """
    kinds = pl.DataFrame({"kind": list(KINDS)})
    totals = classified.group_by("kind").agg(
        pl.len().cast(pl.Int64).alias("records"),
        pl.col("parked_workers").sum().cast(pl.Int64).alias("parked_workers"),
        pl.col("queue_slots").sum().cast(pl.Int64).alias("queue_slots"),
        pl.col("over_pool").cast(pl.Int64).sum().alias("over_pool"),
    )
    return (
        kinds.join(totals, on="kind", how="left", maintain_order="left")
        .with_columns(pl.col("records", "parked_workers", "queue_slots", "over_pool").fill_null(0))
        .select("kind", "records", "parked_workers", "queue_slots", "over_pool")
    )


def bifrost_summary(data: BifrostData, policy: Policy, memory_limit_bytes: int) -> dict[str, Any]:
    """Every Bifrost finding of one gateway as a JSON-able dict with stable keys.

    Shape (used by ``gatewayscope scan --format json``)::

        {"records": {"standard": n, "custom": n},
         "parked_workers": {"standard": n, "custom": n},
         "queue_slots": {"standard": n, "custom": n},
         "records_over_pool": {"standard": n, "custom": n},
         "worker_stack_bytes": {"low": n, "high": n},
         "memory_limit_bytes": n,
         "survives_restart": "yes" | "no" | "at risk",
         "records_to_limit": {"low": n | None, "high": n | None},
         "posture_drift": [setting, ...],
         "unreachable_records": n,
         "pool_policy": {"standard": n, "custom": n, "queue_per_worker": n},
         "boot_memory": {"model": "measured" | "band", "predicted_bytes": n, "memory_limit_bytes": n,
                         "survives_restart": ..., "records_to_limit": n | None,
                         "measured": {"goroutines": n, "stack_inuse_bytes": n, "resident_memory_bytes": n,
                                      "stack_bytes_per_goroutine": x, "baseline_bytes": n,
                                      "other_goroutines": n, "calibration_error_ratio": x,
                                      "trusted": bool} | None,
                         "reason": str | None}}

    ``records_to_limit`` is null for a gateway without workers (nothing to average). ``survives_restart`` and
    ``records_to_limit`` at the top level are the band's; ``boot_memory`` holds the prediction of the model
    used (:mod:`gatewayscope.analysis.memory`: measured from the gateway's runtime metrics, or the band).

    >>> from gatewayscope.snapshot import REACHABILITY_SCHEMA, RECORDS_SCHEMA, frame_from_rows
    >>> records = frame_from_rows([
    ...     ("openai", False, None, 512, 8192, None, "active", "f"),
    ...     ("acme__m", True, "openai", 1000, 5000, "http://gone.invalid", "active", "f"),
    ... ], RECORDS_SCHEMA)
    >>> data = BifrostData(records=records, client_config={"drop_excess_requests": True},
    ...                    reachability=frame_from_rows([("gone.invalid", False, "no such host")],
    ...                                                 REACHABILITY_SCHEMA))
    >>> summary = bifrost_summary(data, Policy(), 512 * 1024 * 1024)
    >>> summary["records"], summary["parked_workers"], summary["records_over_pool"]
    ({'standard': 1, 'custom': 1}, {'standard': 512, 'custom': 1000}, {'standard': 0, 'custom': 1})
    >>> summary["worker_stack_bytes"], summary["survives_restart"], summary["unreachable_records"]
    ({'low': 3096576, 'high': 12386304}, 'yes', 1)
    >>> summary["posture_drift"]
    ['drop_excess_requests', 'enforce_auth_on_inference', 'disable_content_logging']
    """
    classified = classify_records(data.records, policy)
    estimate = boot_estimate(classified, memory_limit_bytes)
    return bifrost_figures(per_kind(classified), estimate, posture_drift(data.client_config),
                           unreachable_records(data.records, data.reachability).height, policy,
                           boot_memory(estimate, data.runtime, data.runtime_error))


def bifrost_figures(kinds: pl.DataFrame, estimate: BootEstimate, drift: list[str], unreachable: int,
                    policy: Policy, memory: BootMemory | None = None) -> dict[str, Any]:
    """The dict of :func:`bifrost_summary` from findings already made.

    ``kinds`` is :func:`per_kind` (extra columns are ignored), ``estimate`` the :func:`boot_estimate`,
    ``drift`` the posture drift, ``unreachable`` the number of unreachable records and ``memory`` the
    boot-memory prediction (:func:`~gatewayscope.analysis.memory.boot_memory`; None: the band's, without a
    reason).
    """
    if memory is None:
        memory = boot_memory(estimate, None, None)
    rows = {row["kind"]: row for row in kinds.iter_rows(named=True)}

    def by_kind(column: str) -> dict[str, int]:
        return {kind: int(rows[kind][column]) for kind in KINDS}

    return {
        "records": by_kind("records"),
        "parked_workers": by_kind("parked_workers"),
        "queue_slots": by_kind("queue_slots"),
        "records_over_pool": by_kind("over_pool"),
        "worker_stack_bytes": {"low": estimate.stack_bytes_low, "high": estimate.stack_bytes_high},
        "memory_limit_bytes": int(estimate.memory_limit_bytes),
        "survives_restart": estimate.survives_restart,
        "records_to_limit": {"low": estimate.records_to_limit_low, "high": estimate.records_to_limit_high},
        "posture_drift": list(drift),
        "unreachable_records": int(unreachable),
        "pool_policy": {
            "standard": policy.standard_pool,
            "custom": policy.custom_pool,
            "queue_per_worker": policy.queue_per_worker,
        },
        "boot_memory": memory.to_json(),
    }


def _mib(value: int) -> str:
    return f"{value / _MIB:,.1f} MiB"


def bifrost_sentence(summary: dict[str, Any]) -> str:
    """One sentence: would this gateway survive a restart within its memory limit (numbers in MiB)?

    >>> summary = {"records": {"standard": 2, "custom": 100},
    ...            "parked_workers": {"standard": 1024, "custom": 100000},
    ...            "worker_stack_bytes": {"low": 206897152, "high": 827588608},
    ...            "memory_limit_bytes": 536870912, "survives_restart": "at risk",
    ...            "records_to_limit": {"low": 265, "high": 67}}
    >>> print(bifrost_sentence(summary))
    This gateway may not survive a restart within its 512.0 MiB memory limit: its 102 provider records \
park 101,024 workers whose stacks alone need 197.3 to 789.2 MiB at boot, and at 8 KiB per worker \
the limit is crossed at 67 records of this average size.
    """
    records = sum(int(n) for n in summary["records"].values())
    workers = sum(int(n) for n in summary["parked_workers"].values())
    low = int(summary["worker_stack_bytes"]["low"])
    high = int(summary["worker_stack_bytes"]["high"])
    limit = _mib(int(summary["memory_limit_bytes"]))
    verdict = summary["survives_restart"]
    head = {
        "yes": f"This gateway would survive a restart within its {limit} memory limit",
        "no": f"This gateway would not survive a restart within its {limit} memory limit",
    }.get(verdict, f"This gateway may not survive a restart within its {limit} memory limit")
    plural = "record" if records == 1 else "records"
    body = (f"its {records:,} provider {plural} park {workers:,} workers whose stacks alone need "
            f"{low / _MIB:,.1f} to {_mib(high)} at boot")
    crossing = summary.get("records_to_limit", {}).get("high")
    if verdict == "no":
        tail = ", even at 2 KiB per worker"
    elif crossing is not None:
        tail = (f", and at 8 KiB per worker the limit is crossed at {int(crossing):,} records "
                "of this average size")
    else:
        tail = ""
    return f"{head}: {body}{tail}."
