"""Bifrost posture drift: the client settings not at the platform's safe posture.

(:func:`bifrost_summary` and :func:`bifrost_sentence` live in :mod:`gatewayscope.analysis.pools`
and can be imported from here as well.)

Pure functions, no I/O and no clock. The platform's safe posture:

* ``drop_excess_requests`` off: a burst past a record's queue waits instead of getting 503
  "request dropped: queue is full";
* ``enforce_auth_on_inference`` on: inference only behind virtual keys;
* ``disable_content_logging`` on: no prompt or completion content in the request log.

Anything else is drift. A setting the gateway does not report counts as its Bifrost default,
which is ``false`` for all three.
"""

from __future__ import annotations

from typing import Any

#: setting -> the value the platform keeps it at, in the order drift is reported
SAFE_POSTURE: dict[str, bool] = {
    "drop_excess_requests": False,
    "enforce_auth_on_inference": True,
    "disable_content_logging": True,
}

#: an older name a build may report instead of the newer one (the newer one wins when both are there)
_PREDECESSORS = {"enforce_auth_on_inference": "enforce_governance_header"}


def _is_on(value: Any) -> bool:
    """A client_config flag as the gateway would read it; anything but a clear true is off."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return False


def posture_drift(client_config: dict[str, Any]) -> list[str]:
    """The settings of ``client_config`` not at the platform's safe posture, in a fixed order.

    A missing (or null) setting counts as its Bifrost default, false. An older build that reports
    only ``enforce_governance_header`` (the predecessor of ``enforce_auth_on_inference``) is
    judged by that.

    >>> posture_drift({})
    ['enforce_auth_on_inference', 'disable_content_logging']
    >>> posture_drift({"drop_excess_requests": True, "enforce_auth_on_inference": True,
    ...                "disable_content_logging": True})
    ['drop_excess_requests']
    >>> posture_drift({"enforce_governance_header": True, "disable_content_logging": True})
    []
    """
    drift: list[str] = []
    for setting, safe in SAFE_POSTURE.items():
        value = client_config.get(setting)
        if value is None and setting in _PREDECESSORS:
            value = client_config.get(_PREDECESSORS[setting])
        if _is_on(value) != safe:
            drift.append(setting)
    return drift

