"""The two speedrun tracks: their target losses and their folders under records/."""
from __future__ import annotations

TARGETS = {"medium": 2.92, "small": 3.28}
RECORD_FOLDERS = {"medium": "track_2_medium", "small": "track_1_short"}


def track_of_run(run) -> str | None:
    """The track of one run: its config's `track`, else an upstream records folder in its path."""
    value = str(run.config.get("track", "")).lower()
    if "medium" in value:
        return "medium"
    if "small" in value or "short" in value:
        return "small"
    for track, folder in RECORD_FOLDERS.items():
        if folder in run.path.parts:
            return track
    return None


def track_of(runs) -> str | None:
    """The track the runs name (config line, else records folder in their path), when they all agree on one."""
    found = {track_of_run(run) for run in runs} - {None}
    return found.pop() if len(found) == 1 else None


# train_gpt_medium.py --base NAME trains this medium record's model and schedule: a run on it is held to that
# record by default (record-check), whatever record is current by then.
BASE_RECORDS = {"r18": 18}


def base_record_of(runs) -> int | None:
    """The record number the runs' --base reproduces (BASE_RECORDS), when every run names the same one."""
    found = {BASE_RECORDS.get(run.config.get("base")) for run in runs}
    return found.pop() if len(found) == 1 else None
