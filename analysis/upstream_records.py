"""The upstream record history of both tracks (records/upstream_records.csv): which record a claim must beat.

The table is plain CSV, one row per line of the upstream README's record tables: track, number, date, record time
(as the README writes it, and in seconds), description, PR, log, and the mean loss / p-value where the record's
own README states them (with that README named in stats_source). Re-timings of an earlier record keep its number
and come after it."""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

RECORDS_TABLE = Path(__file__).resolve().parents[1] / "records" / "upstream_records.csv"
COLUMNS = ("track", "number", "date", "record_time", "record_time_s", "description", "pr", "log", "mean_val_loss",
           "n", "p_value", "stats_source", "note")


class RecordsTableError(ValueError):
    """The records table is missing or malformed; the message names the file and the problem."""


@dataclass(frozen=True)
class UpstreamRecord:
    track: str
    number: int
    date: str
    record_time: str
    record_time_s: float
    description: str
    pr: str
    log: str
    mean_val_loss: float | None
    n: int | None
    p_value: float | None
    stats_source: str
    note: str

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in COLUMNS}


def _optional(text: str, kind):
    return kind(text) if text.strip() else None


def load_records(path=RECORDS_TABLE) -> list[UpstreamRecord]:
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as stream:
            reader = csv.DictReader(stream)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise RecordsTableError(f"{path}: missing column(s) {', '.join(missing)}")
            records = []
            for line, row in enumerate(reader, start=2):
                try:
                    records.append(UpstreamRecord(
                        track=row["track"], number=int(row["number"]), date=row["date"],
                        record_time=row["record_time"], record_time_s=float(row["record_time_s"]),
                        description=row["description"], pr=row["pr"], log=row["log"],
                        mean_val_loss=_optional(row["mean_val_loss"], float), n=_optional(row["n"], int),
                        p_value=_optional(row["p_value"], float), stats_source=row["stats_source"],
                        note=row["note"]))
                except (TypeError, ValueError) as problem:
                    raise RecordsTableError(f"{path}, line {line}: {problem}") from None
    except OSError as problem:
        raise RecordsTableError(f"{path}: cannot be read ({problem.strerror or problem})") from None
    return records


def find_record(records, track: str, number: int | None = None) -> UpstreamRecord:
    """Record `number` of `track` (its latest re-timing), or the track's current record when number is None."""
    mine = [r for r in records if r.track == track]
    if not mine:
        raise RecordsTableError(f"no records of the {track} track in the table")
    if number is None:
        number = max(r.number for r in mine)
    chosen = [r for r in mine if r.number == number]
    if not chosen:
        raise RecordsTableError(f"no record #{number} in the {track} track (1..{max(r.number for r in mine)})")
    return chosen[-1]
