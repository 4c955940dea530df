"""The two speedrun tracks: their target losses and their folders under records/."""
from __future__ import annotations

TARGETS = {"medium": 2.92, "small": 3.28}
RECORD_FOLDERS = {"medium": "track_2_medium", "small": "track_1_short"}


def track_of(runs) -> str | None:
    """The track named by the runs' config lines (`track`), when they all agree on one."""
    found = set()
    for run in runs:
        value = str(run.config.get("track", "")).lower()
        if "medium" in value:
            found.add("medium")
        elif "small" in value or "short" in value:
            found.add("small")
    return found.pop() if len(found) == 1 else None
