"""Remediation plans: pure data computed from the Findings of a Snapshot, serialised to JSON with a content hash.

A plan lists Actions; each names its target, subject, the state before and after, a one-line reason
and the fingerprint of the state it was planned against. :mod:`gatewayscope.remediate.apply` executes
exactly these actions and nothing else. A plan never holds a secret: targets are named, and their
credentials are read from the config when the plan is applied.

Action kinds, in the order apply runs them:

* ``tombstone_backfill``: record tombstones (guarded stores only) BEFORE the deletes, so a straggler
  arriving between tombstone and delete is dropped;
* ``session_delete``: delete a confirmed orphan session (suspected ones only when asked);
* ``posture_fix``: set drifted client-config settings back in one read-modify-write;
* ``pool_shrink``: write a Bifrost record over its kind's pool back with that pool;
* ``record_delete``: delete a Bifrost record that cannot be resized (only when asked).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, overload

import polars as pl

from gatewayscope import __version__
from gatewayscope._files import MAX_CONFIG_BYTES, MAX_PLAN_BYTES, read_bytes, read_text
from gatewayscope.analysis.findings import Findings, TargetFindings, findings
from gatewayscope.analysis.posture import SAFE_POSTURE
from gatewayscope.config import Config
from gatewayscope.errors import ConfigError, PlanError
from gatewayscope.orphan_rule import delete_fences
from gatewayscope.remediate.kinds import ACTION_KINDS, DESTRUCTIVE_KINDS
from gatewayscope.render import human_seconds
from gatewayscope.snapshot import Snapshot

SCHEMA_VERSION = 1
STACK_LOW_BYTES = 2 * 1024
STACK_HIGH_BYTES = 8 * 1024

#: a pace that keeps a 0.1.0 memory gateway's event loop free for real traffic
#: (docs/performance.md#figures-behind-the-code)
DEFAULT_DELETES_PER_SECOND = 20.0
#: without --rate, apply runs one session delete (or batch) at a time per target and pauses after each for
#: a third of its duration: deletes take at most this share of the gateway's time, whatever they cost there
DELETE_DUTY = 0.75
#: what one delete costs the 0.1.0 memory store per session and trace it holds (it scans them all, on the
#: event loop): a range around the measured figure (docs/performance.md#figures-behind-the-code), not a
#: promise (the machine and the store's heap move it)
MEMORY_DELETE_SECONDS_PER_ITEM = (0.2e-6, 0.6e-6)
#: what one session delete on a SQLite store costs apply, lock waits and journal included: short exclusive
#: transactions that each yield to the gateway's writer (docs/remediation.md); the low end is an idle store,
#: the high end one the gateway writes to without pause. A range, not a promise.
SQLITE_DELETE_SECONDS_PER_SESSION = (0.001, 0.008)


@dataclass
class Action:
    """One change to one subject of one target."""

    id: str
    kind: str
    target: str
    subject: str
    before: dict[str, Any]
    after: dict[str, Any]
    reason: str
    fingerprint: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def destructive(self) -> bool:
        return self.kind in DESTRUCTIVE_KINDS

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["destructive"] = self.destructive
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Action:
        fields = {k: data[k] for k in ("id", "kind", "target", "subject", "before", "after", "reason",
                                       "fingerprint")}
        return cls(**fields, details=dict(data.get("details") or {}))


@dataclass
class Plan:
    """A reviewable, single-use list of actions."""

    created_at: float
    targets: list[dict[str, Any]]
    actions: list[Action]
    policy: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    tool_version: str = __version__
    schema_version: int = SCHEMA_VERSION
    id: str = ""
    #: ``hmac-sha256:<hex>`` over the id, when the plan was saved with a plan key (see :func:`plan_key`)
    signature: str | None = None
    #: whether what the plan says can be taken as evidence (its "deleted before" records): True for a plan made
    #: in this process, and for a plan file whose signature was checked with the plan key; never saved
    trusted: bool = field(default=False, compare=False, repr=False)
    #: the file the plan was read from or saved to (None for a plan only in memory); never saved. Apply keeps its
    #: per-plan lock in that file's folder
    path: Path | None = field(default=None, compare=False, repr=False)

    def content(self) -> dict[str, Any]:
        """Everything but the id, in a stable form: what the id hashes."""
        return {
            "schema_version": self.schema_version,
            "created_at": self.created_at,
            "tool_version": self.tool_version,
            "targets": self.targets,
            "policy": self.policy,
            "warnings": self.warnings,
            "actions": [a.to_dict() for a in self.actions],
        }

    def compute_id(self) -> str:
        payload = json.dumps(self.content(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def to_dict(self) -> dict[str, Any]:
        data = {"id": self.id or self.compute_id(), **self.content()}
        if self.signature:
            data["signature"] = self.signature
        return data

    def save(self, path: str | Path, *, key: bytes | None = None) -> Path:
        """Write the plan as JSON; signed with ``key``, or with the configured plan key when there is one."""
        key = key if key is not None else plan_key()
        if key:
            self.signature = sign(self.id or self.compute_id(), key)
        out = Path(path)
        out.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        self.path = out.resolve()
        return out

    def target(self, name: str) -> dict[str, Any]:
        for entry in self.targets:
            if entry["name"] == name:
                return entry
        raise PlanError(f"The plan names no target {name!r}.")

    def target_index(self) -> dict[str, dict[str, Any]]:
        """Each target's entry by name."""
        return {entry["name"]: entry for entry in self.targets}


#: the plan key: the key itself in this variable, or a file holding it in PLAN_KEY_FILE_ENV
PLAN_KEY_ENV = "GATEWAYSCOPE_PLAN_KEY"
PLAN_KEY_FILE_ENV = "GATEWAYSCOPE_PLAN_KEY_FILE"
_SIGNATURE_PREFIX = "hmac-sha256:"


class PlanFileError(ConfigError, PlanError):
    """A plan file that does not follow the plan schema: one line per problem (a usage error, exit 2)."""

    kind = "plan"


def plan_key() -> bytes | None:
    """The HMAC key plans are signed and checked with, from the environment (None when none is set).

    ``GATEWAYSCOPE_PLAN_KEY`` holds the key itself; ``GATEWAYSCOPE_PLAN_KEY_FILE`` names a file holding
    it (surrounding whitespace is ignored). With a key set, ``plan`` signs what it writes and ``apply``
    refuses a plan without a valid signature.
    """
    value = os.environ.get(PLAN_KEY_ENV, "")
    if value.strip():
        return value.strip().encode()
    if value:
        raise ConfigError(f"{PLAN_KEY_ENV} is set but holds only spaces: set it to the plan key, or unset it to "
                          "work without one.")
    path = os.environ.get(PLAN_KEY_FILE_ENV, "")
    if not path:
        return None
    try:
        key = read_bytes(Path(path).expanduser(), limit=MAX_CONFIG_BYTES).strip()
    except OSError as err:
        raise ConfigError(f"{PLAN_KEY_FILE_ENV}={path}: cannot read the plan key ({err.strerror or err}).") from None
    if not key:
        raise ConfigError(f"{PLAN_KEY_FILE_ENV}={path}: the file is empty; put the plan key in it.")
    return key


def sign(plan_id: str, key: bytes) -> str:
    """The signature of a plan: an HMAC of its id, which is itself the hash of its whole content."""
    return _SIGNATURE_PREFIX + hmac.new(key, f"gatewayscope-plan:{plan_id}".encode(), hashlib.sha256).hexdigest()


def _is_int(value: Any, minimum: int | None = None) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and (minimum is None or value >= minimum))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check(problems: list[str], where: str, ok: bool, expected: str, value: Any) -> bool:
    if not ok:
        shown = repr(value)
        problems.append(f"{where}: expected {expected}, got {shown[:80]}{'...' if len(shown) > 80 else ''}")
    return ok


def _check_keys(problems: list[str], where: str, value: Any, required: Mapping[str, tuple[Any, str]]) -> None:
    """``value`` must be an object holding each required key, each passing its (test, description)."""
    if not _check(problems, where, isinstance(value, dict), "an object", value):
        return
    for key, (test, expected) in required.items():
        if key not in value:
            problems.append(f"{where}.{key}: missing ({expected})")
        else:
            _check(problems, f"{where}.{key}", test(value[key]), expected, value[key])


def _string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


_POSITIVE = (lambda v: _is_int(v, 1), "a whole number > 0")
_COUNT = (lambda v: _is_int(v, 0), "a whole number >= 0")
_KIND_FIELDS: dict[str, dict[str, dict[str, tuple[Any, str]]]] = {
    "pool_shrink": {"before": {"concurrency": _COUNT, "buffer_size": _COUNT},
                    "after": {"concurrency": _POSITIVE, "buffer_size": _POSITIVE}},
    "record_delete": {"before": {}, "after": {"exists": (lambda v: v is False, "false")}},
    "posture_fix": {"before": {}, "after": {}},
    "tombstone_backfill": {"before": {}, "after": {"session_ids": (_string_list, "a list of session id strings")}},
    "session_delete": {"before": {"trace_count": _POSITIVE}, "after": {"trace_count": (lambda v: v == 0, "0")}},
}


def validate_plan_data(data: Any) -> list[str]:
    """Every way ``data`` (a parsed plan file) breaks the plan schema, one line each; [] when none.

    >>> validate_plan_data({"schema_version": 1, "id": "x", "created_at": 0, "targets": [], "actions": [{}]})[:2]
    ['actions[0].id: missing (a string)', 'actions[0].kind: missing (one of the action kinds)']
    """
    problems: list[str] = []
    if not isinstance(data, dict):
        return [f"the plan: expected a JSON object, got {type(data).__name__}"]
    _check_keys(problems, "plan", data, {
        "id": (lambda v: isinstance(v, str), "a string"),
        "created_at": (_is_number, "a number"),
        "targets": (lambda v: isinstance(v, list), "a list"),
        "actions": (lambda v: isinstance(v, list), "a list"),
    })
    for key, test, expected in (("policy", lambda v: isinstance(v, dict), "an object"),
                                ("warnings", lambda v: isinstance(v, list) and all(isinstance(w, str) for w in v),
                                 "a list of strings"),
                                ("tool_version", lambda v: isinstance(v, str), "a string"),
                                ("signature", lambda v: isinstance(v, str), "a string")):
        if key in data:
            _check(problems, f"plan.{key}", test(data[key]), expected, data[key])
    names: set[str] = set()
    targets: list[Any] = data["targets"] if isinstance(data.get("targets"), list) else []
    actions: list[Any] = data["actions"] if isinstance(data.get("actions"), list) else []
    for index, entry in enumerate(targets):
        where = f"targets[{index}]"
        _check_keys(problems, where, entry, {
            "name": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
            "kind": (lambda v: v in ("rllm", "bifrost"), "'rllm' or 'bifrost'"),
            "address": (lambda v: isinstance(v, str), "a string"),
        })
        if isinstance(entry, dict):
            if isinstance(entry.get("name"), str):
                names.add(entry["name"])
            if "capabilities" in entry:
                _check(problems, f"{where}.capabilities", isinstance(entry["capabilities"], dict)
                       and all(isinstance(v, bool) for v in entry["capabilities"].values()),
                       "an object of true/false", entry["capabilities"])
    for index, action in enumerate(actions):
        where = f"actions[{index}]"
        _check_keys(problems, where, action, {
            "id": (lambda v: isinstance(v, str), "a string"),
            "kind": (lambda v: v in ACTION_KINDS, "one of the action kinds"),
            "target": (lambda v: isinstance(v, str) and v in names, "the name of one of the plan's targets"),
            "subject": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
            "before": (lambda v: isinstance(v, dict), "an object"),
            "after": (lambda v: isinstance(v, dict), "an object"),
            "reason": (lambda v: isinstance(v, str), "a string"),
            "fingerprint": (lambda v: isinstance(v, str), "a string"),
        })
        if not isinstance(action, dict):
            continue
        if "details" in action:
            _check(problems, f"{where}.details", action["details"] is None or isinstance(action["details"], dict),
                   "an object", action["details"])
        fields = _KIND_FIELDS.get(action.get("kind"))  # type: ignore[arg-type]
        if fields is None:
            continue
        for part in ("before", "after"):
            if isinstance(action.get(part), dict):
                _check_keys(problems, f"{where}.{part}", action[part], fields[part])
        kind = action["kind"]
        details: dict[str, Any] = action["details"] if isinstance(action.get("details"), dict) else {}
        if kind == "posture_fix" and isinstance(action.get("after"), dict):
            for setting, value in action["after"].items():
                _check(problems, f"{where}.after.{setting}", SAFE_POSTURE.get(setting, object()) == value
                       and isinstance(value, bool), f"one of {sorted(SAFE_POSTURE)} set to its safe value", value)
        if kind == "session_delete":
            for key, test, expected in (
                    ("trace_ids", lambda v: v is None or _string_list(v), "null or a list of trace id strings"),
                    ("last_trace_at", lambda v: v is None or _is_number(v), "null or a number"),
                    ("confidence", lambda v: v in ("confirmed", "suspected"), "'confirmed' or 'suspected'"),
                    ("weight_version", lambda v: v is None or _is_int(v), "null or a whole number"),
                    ("deleted_before", lambda v: v is None or (isinstance(v, dict) and (
                        _is_number(v.get("deleted_at")) or isinstance(v.get("journal"), str))),
                     "null or {\"deleted_at\": <epoch seconds>}")):
                if key in details:
                    _check(problems, f"{where}.details.{key}", test(details[key]), expected, details[key])
    return problems


def load_plan(path: str | Path, *, key: bytes | None = None, ignore_signature: bool = False) -> Plan:
    """Read a plan file, check it against the plan schema and its id against its content.

    With a plan key (``key``, or the one configured in the environment) the plan must carry a valid
    signature, and is then :attr:`Plan.trusted`. A signed plan read where no key is set is refused (its
    signature cannot be checked) unless ``ignore_signature``: it is then read as an unsigned one. Raises
    PlanFileError (one line per schema problem) or PlanError.
    """
    source = Path(path)
    try:
        data = json.loads(read_text(source, limit=MAX_PLAN_BYTES))
    except FileNotFoundError:
        raise PlanError(f"{source}: no such plan file; make one with 'gatewayscope plan --out {source}'.") from None
    except RecursionError:
        raise PlanFileError(f"{source} is not a readable plan file: it is nested too deeply.") from None
    except OSError as err:
        raise PlanError(f"{source} is not a readable plan file: {err.strerror or err}.") from None
    except ValueError as err:
        raise PlanError(f"{source} is not a readable plan file: {err}") from None
    if not isinstance(data, dict) or "actions" not in data:
        raise PlanError(f"{source} is not a gatewayscope plan (no actions).")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise PlanError(f"{source} has plan schema {data.get('schema_version')!r}; this gatewayscope reads "
                        f"schema {SCHEMA_VERSION}. Make a new plan.")
    problems = validate_plan_data(data)
    if problems:
        raise PlanFileError([f"{source} does not follow the plan schema ({len(problems)} problem(s)); make a new "
                             "plan with 'gatewayscope plan' instead of editing one:",
                             *(f"  {line}" for line in problems)])
    plan = Plan(
        created_at=float(data["created_at"]),
        targets=list(data["targets"]),
        actions=[Action.from_dict(a) for a in data["actions"]],
        policy=dict(data.get("policy") or {}),
        warnings=list(data.get("warnings") or []),
        tool_version=str(data.get("tool_version", "")),
        schema_version=int(data["schema_version"]),
        signature=data.get("signature"),
        path=source.resolve(),
    )
    plan.id = plan.compute_id()
    if data.get("id") != plan.id:
        raise PlanError(f"{source} was changed after it was made (its id does not match its content); "
                        "make a new plan instead of editing one.")
    key = key if key is not None else plan_key()
    if key:
        if not plan.signature:
            raise PlanError(f"{source} is not signed, and a plan key is set ({PLAN_KEY_ENV}): only plans made "
                            "with that key are applied. Make the plan again with the key set.")
        if not hmac.compare_digest(str(plan.signature), sign(plan.id, key)):
            raise PlanError(f"{source} has a signature that the plan key does not match: it was changed, or made "
                            "with another key. Make the plan again with this key.")
        plan.trusted = True
    elif plan.signature and not ignore_signature:
        raise PlanError(f"{source} is signed, but no plan key is set here ({PLAN_KEY_ENV} or {PLAN_KEY_FILE_ENV}), "
                        "so its signature cannot be checked. Set the key it was signed with, or pass "
                        "--ignore-signature to read it as an unsigned plan.")
    return plan


# -- building -----------------------------------------------------------------------------------------

def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def session_fingerprint(trace_count: int, trace_ids: Iterable[str] | None) -> str:
    """What a session-delete was planned against: its trace count and, when the scan read them, its trace ids.

    ``trace_ids=None`` means the scan did not read the session's traces (the sources read them only for
    one-trace sessions idle past the threshold and for tombstoned ones; an orphan confirmed by an earlier
    delete can be neither), so only the count is compared.

    >>> session_fingerprint(1, ["t1"]) == session_fingerprint(1, ["t2"])
    False
    >>> session_fingerprint(1, None) == session_fingerprint(1, ["t1"])
    False
    """
    if trace_ids is None:
        return _hash({"trace_count": int(trace_count)})
    return _hash({"trace_count": int(trace_count), "trace_ids": sorted(trace_ids)})


def posture_fingerprint(client_config: dict[str, Any]) -> str:
    """The client config apart from the posture settings a fix changes."""
    return _hash({k: v for k, v in client_config.items() if k not in SAFE_POSTURE})


def _rllm_actions(found: TargetFindings, *, include_suspected: bool, tombstone_ids: Collection[str],
                  deleted_ids: Mapping[str, float], warnings: list[str]) -> list[Action]:
    snap, data, orphans = found.snapshot, found.snapshot.trace_store, found.orphans
    assert data is not None and orphans is not None
    chosen = orphans if include_suspected else orphans.filter(pl.col("confidence") == "confirmed")
    skipped = orphans.height - chosen.height
    if skipped:
        warnings.append(f"{snap.name}: {skipped} suspected orphan session(s) left out; --include-suspected "
                        "plans their deletion too (check first that none is a live session).")
    elif include_suspected and (orphans["confidence"] == "suspected").any():
        warnings.append(f"{snap.name}: the plan deletes suspected orphans: sessions with one idle trace that "
                        "nothing proves deleted. Review them before applying.")
    traces = data.candidate_traces.group_by("session_id").agg(pl.col("trace_id"))
    trace_ids = {row[0]: row[1] for row in traces.iter_rows()}
    changing = data.candidate_traces.group_by("session_id").len().join(
        data.sessions.select("session_id", "trace_count"), on="session_id").filter(
        pl.col("len") != pl.col("trace_count"))
    if changing.height:
        warnings.append(f"{snap.name}: the store changed while it was read ({changing.height} session(s) "
                        "gained or lost traces during the scan); apply re-reads every session first.")

    actions: list[Action] = []
    tombstoned = set(data.tombstoned_ids)
    guarded = data.guard is not None and data.guard.enabled
    delete_ids = chosen["session_id"].to_list()
    # only ids proven deleted are tombstoned ahead: a suspected orphan may still be live, and a tombstone
    # would drop its next write even when its delete then ends stale. Every delete on a guarded store
    # records its own tombstone atomically (the guard's trigger, or the guarded launcher's delete).
    # An id that already carries a tombstone needs none: the backfill would be a no-op reported as done.
    proven = chosen.filter(pl.col("confidence") == "confirmed")["session_id"].to_list()
    backfill_ids = sorted((set(proven) | set(tombstone_ids)) - tombstoned)
    if backfill_ids and guarded:
        actions.append(Action(
            id="", kind="tombstone_backfill", target=snap.name, subject="tombstones",
            before={"tombstones": data.guard.tombstones if data.guard else 0},
            after={"session_ids": backfill_ids},
            reason=(f"tombstone {len(backfill_ids)} deleted session id(s) before deleting, so a late write "
                    "cannot bring them back"),
            fingerprint=_hash({"session_ids": backfill_ids}),
        ))
    if (delete_ids or backfill_ids) and not guarded and data.guard is not None:  # there, but not working
        how = (f"re-run 'gatewayscope guard install {snap.address}' (its triggers are missing or altered)"
               if data.access == "sqlite" else "restart the gateway with --max-tombstones above 0")
        warnings.append(f"{snap.name}: the tombstone guard is disabled, so no tombstones are planned and a "
                        f"straggler can bring a deleted session back; to stop that: {how}.")
    elif (delete_ids or backfill_ids) and not guarded:
        how = (f"gatewayscope guard install {snap.address}" if data.access == "sqlite"
               else "run the gateway with 'gatewayscope gateway' instead of 'rllm-model-gateway'")
        warnings.append(f"{snap.name}: no tombstone guard, so no tombstones are planned and a straggler can "
                        f"bring a deleted session back; to stop that: {how}.")
    for row in chosen.iter_rows(named=True):
        sid = row["session_id"]
        ids = trace_ids.get(sid)  # None: the scan did not read this session's traces
        actions.append(Action(
            id="", kind="session_delete", target=snap.name, subject=sid,
            before={"trace_count": row["trace_count"]}, after={"trace_count": 0},
            reason=f"{row['confidence']} orphan: {row['reason']}",
            fingerprint=session_fingerprint(row["trace_count"], ids),
            details={"confidence": row["confidence"], "task": row["task"], "prompt_tokens": row["prompt_tokens"],
                     "trace_ids": sorted(ids) if ids is not None else None,
                     # what apply re-checks against the live store before it deletes (see apply's recheck)
                     "last_trace_at": row["last_trace_at"], "weight_version": row["weight_version"],
                     "deleted_before": _deleted_evidence(sid, deleted_ids, tombstoned)},
        ))
    if delete_ids:
        # what apply does: one at a time (or one batch at a time), deletes taking at most DELETE_DUTY of the
        # gateway's time, unless --rate sets a pace
        pace = (f"so that deletes take at most {DELETE_DUTY:.0%} of the gateway's time and its traffic waits "
                "behind one delete at most")
        if data.access == "sqlite":
            low, high = (len(delete_ids) * cost for cost in SQLITE_DELETE_SECONDS_PER_SESSION)
            how = "with the gateway's own delete statements on its SQLite file, in short exclusive transactions"
            when = ("; about " + (f"{human_seconds(low)} (idle store) to {human_seconds(high)} (busy gateway)"
                                  if high >= 1 else "a second or less"))
        elif data.capabilities.get("batch_delete") and not data.capabilities.get("guard"):
            how, when = "through the gateway's batch delete (POST /sessions/batch_delete), one batch at a time", ""
        else:
            # a guarded launcher deletes by compare-and-delete even where it has batch delete: nothing can land
            # between the check and the delete
            how = ("through the guarded launcher's compare-and-delete, one at a time" if data.capabilities.get("guard")
                   else "through the gateway's own delete, one at a time")
            when = "; the 0.1.0 memory store scans every session on each delete: " + _memory_delete_time(
                data.session_count, data.trace_count, chosen)
        warnings.append(f"{snap.name}: deletes {len(delete_ids)} session(s) {how}, {pace}{when} "
                        "(apply --rate sets a fixed pace instead).")
    return actions


def _deleted_evidence(session_id: str, deleted_ids: Mapping[str, float],
                      tombstoned: Collection[str]) -> dict[str, float] | None:
    """When a "deleted before" orphan's earlier delete was recorded (for review: apply takes its evidence from
    the journals it is given, or a signed plan), or None."""
    if session_id in tombstoned or session_id not in deleted_ids:
        return None
    return {"deleted_at": float(deleted_ids[session_id])}


def _memory_delete_time(sessions: int, traces: int, chosen: pl.DataFrame) -> str:
    """How long apply's deletes of ``chosen`` take on a 0.1.0 memory store of that size, as a range."""
    items = sessions + traces
    removed = chosen.height + int(chosen["trace_count"].sum() or 0)
    # each delete scans what is left; the store shrinks by one session and its traces per delete
    scanned = chosen.height * (items - removed / 2)
    low, high = (scanned * cost / DELETE_DUTY for cost in MEMORY_DELETE_SECONDS_PER_ITEM)
    if high < 1:
        return "under a second"
    return f"about {human_seconds(low)} to {human_seconds(high)} at this store's size"


def _bifrost_actions(found: TargetFindings, *, include_deletes: bool, warnings: list[str]) -> list[Action]:
    snap, data, classified = found.snapshot, found.snapshot.bifrost, found.records
    assert data is not None and classified is not None
    if data.records["fingerprint"].null_count():
        # apply writes a record only while it still matches what was planned, which needs these
        raise PlanError(f"{snap.name}: the records were read without plan fingerprints (a report-only read, "
                        "like the exporter's or a scan that saved no snapshot); plan from a fresh read "
                        "('gatewayscope plan') or a snapshot saved with 'gatewayscope scan --save-snapshot'.")
    actions: list[Action] = []

    drift = list(found.posture_drift)
    if drift:
        actions.append(Action(
            id="", kind="posture_fix", target=snap.name, subject="client_config",
            before={s: bool(data.client_config.get(s, False)) for s in drift},
            after={s: SAFE_POSTURE[s] for s in drift},
            reason="client config drifted from the safe posture: " + ", ".join(drift),
            fingerprint=posture_fingerprint(data.client_config),
        ))

    blocked = 0
    for row in classified.sort("name").iter_rows(named=True):
        name = row["name"]
        if row["unreachable"]:
            if include_deletes:
                actions.append(Action(
                    id="", kind="record_delete", target=snap.name, subject=name,
                    before={"concurrency": row["concurrency"], "buffer_size": row["buffer_size"],
                            "base_url": row["base_url"]},
                    after={"exists": False},
                    reason=(f"cannot be resized ({row['unreachable_reason']}); a provision still in use "
                            "sets it up again"),
                    fingerprint=row["fingerprint"],
                    details={"record_kind": row["kind"], "frees_workers": row["parked_workers"],
                             "frees_bytes": {"low": row["parked_workers"] * STACK_LOW_BYTES,
                                             "high": row["parked_workers"] * STACK_HIGH_BYTES}},
                ))
            elif row["over_pool"]:
                blocked += 1
            continue
        if not row["over_pool"]:
            continue
        pool = int(row["target_pool"])
        queue = int(row["target_queue"])
        freed = int(row["concurrency"]) - pool
        actions.append(Action(
            id="", kind="pool_shrink", target=snap.name, subject=name,
            before={"concurrency": row["concurrency"], "buffer_size": row["buffer_size"]},
            after={"concurrency": pool, "buffer_size": queue},
            reason=f"{row['kind']} record parks {row['concurrency']:,} workers; its kind's pool is {pool}",
            fingerprint=row["fingerprint"],
            details={"record_kind": row["kind"], "has_base_url": row["base_url"] is not None,
                     "frees_workers": freed,
                     "frees_bytes": {"low": freed * STACK_LOW_BYTES, "high": freed * STACK_HIGH_BYTES}},
        ))
    if blocked:
        warnings.append(f"{snap.name}: {blocked} record(s) over their pool cannot be resized (base URL does not "
                        "resolve, or status error): the gateway would refuse the write. --include-deletes plans "
                        "their deletion; a provision still in use sets such a record up again.")
    return actions


@overload
def build_plan(found: Findings, config: None = None, *, only: Collection[str] = (), include_suspected: bool = False,
               include_deletes: bool = False, tombstone_ids: Collection[str] = (),
               created_at: float | None = None) -> Plan: ...
@overload
def build_plan(found: Snapshot, config: Config, *, only: Collection[str] = (), include_suspected: bool = False,
               include_deletes: bool = False, tombstone_ids: Collection[str] = (),
               deleted_ids: Mapping[str, Any] | None = None, created_at: float | None = None) -> Plan: ...


def build_plan(
    found: Findings | Snapshot,
    config: Config | None = None,
    *,
    only: Collection[str] = (),
    include_suspected: bool = False,
    include_deletes: bool = False,
    tombstone_ids: Collection[str] = (),
    deleted_ids: Mapping[str, Any] | None = None,
    created_at: float | None = None,
) -> Plan:
    """The plan that repairs ``found`` (the :class:`~gatewayscope.Findings` of a snapshot). Pure: no I/O, and no
    clock unless ``created_at`` is None.

    The plan deletes confirmed orphan sessions (suspected ones too with ``include_suspected``), tombstones
    proven-deleted ids first on guarded stores, sets drifted Bifrost posture back, shrinks records over
    their kind's pool and, with ``include_deletes``, deletes records that cannot be resized. ``only``
    restricts the action kinds; ``tombstone_ids`` adds ids to backfill on guarded stores. Session ids known to
    have been deleted before, with the moment of that delete, confirm an orphan whose traces all came before
    it: give them to :func:`~gatewayscope.findings`. The plan records that evidence for review; apply never
    takes it from the plan file (an unsigned file can be edited): it needs the same journals again, or a
    signed plan.

    A Snapshot with its ``config`` (and ``deleted_ids``) is analysed first.

    >>> from gatewayscope import Config, Policy, Snapshot, findings
    >>> empty = findings(Snapshot(taken_at=0.0, targets=[]), Config(targets=[], policy=Policy()))
    >>> plan = build_plan(empty, created_at=0.0)
    >>> len(plan.actions), plan.policy["include_suspected"], len(plan.id)
    (0, False, 32)
    """
    if isinstance(found, Snapshot):
        if config is None:
            raise TypeError("build_plan(snapshot, config): a snapshot is planned under a config's policy")
        found = findings(found, config, deleted_ids=deleted_ids)
    elif config is not None or deleted_ids:
        raise TypeError("build_plan(findings): the findings carry their policy and deleted ids; give them to "
                        "findings() instead")
    unknown = set(only) - set(ACTION_KINDS)
    if unknown:
        raise PlanError(f"Unknown action kind(s) {', '.join(sorted(unknown))}; choose from {', '.join(ACTION_KINDS)}.")
    warnings: list[str] = []
    actions: list[Action] = []
    targets: list[dict[str, Any]] = []
    for target in found.targets:
        snap = target.snapshot
        entry: dict[str, Any] = {"name": snap.name, "kind": snap.kind, "address": snap.address}
        if not snap.up:
            warnings.append(f"{snap.name}: not planned, it did not answer ({snap.error}).")
            entry["skipped"] = True
            targets.append(entry)
            continue
        if snap.trace_store is not None:
            entry["access"] = snap.trace_store.access
            entry["capabilities"] = dict(snap.trace_store.capabilities)
            entry["guarded"] = snap.trace_store.guard is not None
            actions += _rllm_actions(target, include_suspected=include_suspected, tombstone_ids=tombstone_ids,
                                     deleted_ids=delete_fences(found.deleted_ids, snap.name), warnings=warnings)
        elif snap.bifrost is not None:
            actions += _bifrost_actions(target, include_deletes=include_deletes, warnings=warnings)
        targets.append(entry)
    if only:
        actions = [a for a in actions if a.kind in only]
    actions.sort(key=lambda a: (ACTION_KINDS.index(a.kind), a.target, a.subject))
    seen: set[tuple[str, str]] = set()
    for index, action in enumerate(actions, start=1):
        key = (action.target, action.subject)
        if key in seen:  # one action per subject: apply re-reads and writes each subject once
            raise PlanError(f"internal: two actions on {action.target}/{action.subject}")
        seen.add(key)
        action.id = f"a{index:05d}"
    if any(a.destructive for a in actions):
        warnings.insert(0, "This plan deletes things: apply needs --allow-delete (or the delete confirmation in "
                           "the notebook) to run the deletes.")
    plan = Plan(
        created_at=time.time() if created_at is None else created_at,
        targets=targets,
        actions=actions,
        policy={**found.policy.to_dict(), "include_suspected": include_suspected, "include_deletes": include_deletes},
        warnings=warnings,
        trusted=True,
    )
    plan.id = plan.compute_id()
    return plan


def plan_summary(plan: Plan) -> dict[str, Any]:
    """Counts by kind and target, and the memory the shrinks and record deletes free (low/high bytes)."""
    by_kind: dict[str, int] = {kind: 0 for kind in ACTION_KINDS}
    by_target: dict[str, dict[str, int]] = {}
    frees = {"low": 0, "high": 0}
    workers = 0
    for action in plan.actions:
        by_kind[action.kind] += 1
        by_target.setdefault(action.target, {}).setdefault(action.kind, 0)
        by_target[action.target][action.kind] += 1
        if "frees_bytes" in action.details:
            frees["low"] += int(action.details["frees_bytes"]["low"])
            frees["high"] += int(action.details["frees_bytes"]["high"])
            workers += int(action.details.get("frees_workers", 0))
    return {"actions": len(plan.actions), "by_kind": by_kind, "by_target": by_target,
            "frees_workers": workers, "frees_bytes": frees,
            "destructive": sum(1 for a in plan.actions if a.destructive)}
