"""What agents report of the checks before a job's first step, and of the standby, typed
(inbound.py holds the table of every class; tests/unit/test_inbound.py holds each equal to its
schema)."""

from __future__ import annotations

from dataclasses import dataclass

from ftrun.wire.inbound_base import Message, Report


@dataclass(frozen=True, kw_only=True)
class LinkProbed(Report):
    """One host's figures of the link check (controller/link_check.py), a list entry per round
    it was in: the peer, the median latency and the bandwidth of its pair, or why it has none."""

    KIND = "link_probed"
    check: int
    rounds: list[int]
    peers: list[str]
    latency_s: list[float | None]
    bandwidth_Bps: list[float | None]
    errors: list[str | None]
    port: int | None = None  # a fresh port its host offers for the next rendezvous


@dataclass(frozen=True, kw_only=True)
class StandbyReady(Message):
    """The standby host's agent is ready to run the standby controller, on this port of its
    host (controller/standby_desk.py)."""

    KIND = "standby_ready"
    port: int
