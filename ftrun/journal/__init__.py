"""The journal: a job's events, the only source of what happened (STYLE.md).

    writer.py  the controller's Journal: events and log lines appended, never lost to a full disk
    read.py    reading a job directory back: its events, where a resumed job goes on from
    schema.py  what a well-formed event is (a reader skips and counts the rest)

Ground floor: imports nothing above it; the controller writes it, everyone else reads it.
"""

from ftrun.journal.writer import CONFIG_FILE, EVENTS_FILE, RESERVE_FILE, Journal

__all__ = ["CONFIG_FILE", "EVENTS_FILE", "RESERVE_FILE", "Journal"]
