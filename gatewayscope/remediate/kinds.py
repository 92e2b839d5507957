"""What the command line needs to know of plans before it loads them: the action kinds and the formats."""

from __future__ import annotations

#: action kinds, in the order apply runs them (tombstones before deletes)
ACTION_KINDS = ("tombstone_backfill", "session_delete", "posture_fix", "pool_shrink", "record_delete")
DESTRUCTIVE_KINDS = frozenset({"session_delete", "record_delete"})
#: the formats ``show`` renders a plan in
PLAN_FORMATS = ("text", "md", "html")
