"""Which snapshots of a rank go to storage, agreed by all ranks, and the worker's replies.

This module owns the persist side of a Manager: the collective choice of whether a save is
persisted (an all-reduce: is any rank's worker still busy, did a preemption notice come, is it
too soon after the last persist; started at the save before, in the background, when every save
votes; and at a persist, has the tensor layout changed so the DCP storage plan must be made
again), the same vote's agreement on how many saves apart the full copies of a live snapshot
are (live.py: every rank must copy at the same saves for them to restore together), the cached
storage plan, sending the "persist" command through the `PersistClient`, the worker's replies turned into slot-table events and stats, and
close()'s agreement to persist the last snapshot. The Manager keeps the order of things in the
training thread and the snapshot copy. Both drive one `SlotTable` under one lock (`cond`), so
which slot the worker reads stays a single state machine (`slot_table.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ftrun import runtime
from ftrun.checkpoint import dcp_layout, slots
from ftrun.checkpoint.comm import Comm
from ftrun.checkpoint.config import AUTO_DUTY, CheckpointConfig
from ftrun.checkpoint.errors import CheckpointError
from ftrun.checkpoint.persist_client import PersistClient, persist_message
from ftrun.checkpoint.restore import warn
from ftrun.checkpoint.slot_layout import TensorEntry, signature
from ftrun.checkpoint.slot_table import SlotTable
from ftrun.checkpoint.stats import Stats

# Background votes on the persist (see wanted()) are about this far apart, in saves agreed from
# the ranks' save rate; at most MAX_VOTE_EVERY saves apart, so that steps that slow down (20 ms,
# then 1 s) delay a notice by 16 s at most, well inside the preemption grace (60 s).
VOTE_INTERVAL_S = 0.25
MAX_VOTE_EVERY = 16


class Persister:
    """The persists of one rank; every method that says "collective" runs on all ranks."""

    def __init__(
        self,
        config: CheckpointConfig,
        *,
        comm: Comm,
        tier: slots.MemoryTier,
        table: SlotTable,
        cond: threading.Condition,
        stats: Stats,
        nonce: str,
    ) -> None:
        self.config = config
        self._comm, self._tier, self._slots, self._cond = comm, tier, table, cond
        self._stats, self._nonce = stats, nonce
        self.plan: dcp_layout.StoragePlan | None = None  # the last one made, for its signature
        self.last_started: int | None = None  # step of the last persist started
        self._last_started_at: float | None = None  # and when (time.monotonic())
        self._closing = False
        self.superseded: str | None = None  # why the worker's commit was refused (fence.py)
        self._next_vote: Callable[[], list[int]] | None = None  # started by the last vote
        self._voted_at: float | None = None  # when this rank last voted (time.monotonic())
        self._saves_since_vote = 0
        self._vote_every = 1  # saves between background votes, agreed by the last one
        # Saves between full copies under a live snapshot: this rank's wish (the Manager's, from
        # what the last copy cost) and what the ranks agreed at the last vote (the largest wish).
        # A fixed config.full_copy_every is the same on every rank: no vote needed.
        self.proposed_full_copy_every = self.full_copy_every = config.full_copy_every or 1
        self.client = PersistClient(priority=config.persist_priority, on_message=self._on_message)

    def wanted(
        self, step: int, keyed: list[tuple[str, torch.Tensor]], sig: str, *, preempted: bool
    ) -> tuple[bool, bool]:
        """Collective: (whether the save of `step` is persisted, whether it is the save a
        preemption notice asked for). A save is persisted when its step is due, the last
        persist started `persist_interval` seconds ago or more, and no rank's worker is busy;
        or when any rank saw the notice (`preempted`): then after the persist in flight,
        whatever the step and the time. When it is persisted and the layout changed, make the
        storage plan for it.

        Where saves would vote at every one (under ftrun, which may send a notice, or when
        every step is due), the vote runs in the background instead (Comm.max_ints_later): a
        save starts one that the next voting save reads, and the ranks vote every few saves
        (VOTE_INTERVAL_S apart, by their agreed save rate), and at every due step when not
        every step is due. So a save decides on the state of a vote up to ~0.25 s old, without
        stopping all ranks for a collective (each costs ~0.7 ms here): a persist starts up to a
        vote after the worker became free, a notice is honoured up to a vote after a rank saw
        it."""
        due = step % self.config.persist_every == 0
        if not self._comm.distributed:  # nobody to agree with
            self.full_copy_every = self.proposed_full_copy_every
        # A live snapshot's full copies are agreed at the votes, so with one the ranks vote
        # every few saves. The same on every rank: it depends on the config alone.
        live = self.config.live_snapshot and self.config.memory_dir is not None
        background = self._comm.distributed and (
            self.config.preempt_file is not None or self.config.persist_every == 1 or live
        )
        if background:
            self._saves_since_vote += 1
            # A persist every step is a persist at each vote; a rarer one votes when it is due.
            voting = self._saves_since_vote >= self._vote_every
            if not (voting or (due and self.config.persist_every > 1)):
                return False, False
        elif not due and self.config.preempt_file is None:
            return False, False
        busy, urgent, early, save_interval_us, full_copy_every = self._agree(preempted)
        self.full_copy_every = max(1, full_copy_every)
        if urgent and busy:  # the notice's save must reach storage: after the one in flight
            (busy,) = self._comm.max_ints([int(not self.wait_idle(self.config.persist_timeout))])
        persist = not busy and bool(urgent or (due and not early))
        if persist:
            # Layouts are known only now (a rank's can change between two saves): agreed at
            # the persists, which are seconds apart.
            (replan,) = self._comm.max_ints([int(self.plan is None or self.plan.signature != sig)])
            if replan:
                self.plan = dcp_layout.plan_storage(
                    dict(keyed), comm=self._comm, signature=sig, key=self.config.hmac_key
                )
        if background:
            if save_interval_us > 0:  # the slowest rank's: every rank computes the same
                self._vote_every = max(
                    1, min(MAX_VOTE_EVERY, int(VOTE_INTERVAL_S * 1e6 / save_interval_us))
                )
            # The notice this save honours is handled: it is not voted again.
            self._next_vote = self._comm.max_ints_later(
                self._vote(preempted and not urgent, starting=persist, background=True)
            )
            self._saves_since_vote = 0
        return persist, bool(urgent)

    def _agree(self, preempted: bool) -> list[int]:
        """Collective: [any rank's worker busy, any rank saw a notice, too soon for any rank,
        the slowest rank's time per save (µs) since its last vote, the most saves between full
        copies any rank asks for]: the vote started at the last voting save, else one now."""
        if self._next_vote is not None:
            vote, self._next_vote = self._next_vote, None
            return vote()
        return self._comm.max_ints(self._vote(preempted, starting=False, background=False))

    def _vote(self, preempted: bool, *, starting: bool, background: bool) -> list[int]:
        # Each rank reads its own clock; all ranks started the last persist at the same save, so
        # they differ by the skew of one collective, and "any rank says too soon" is agreed.
        busy = starting or self._slots.persisting
        self._stats.votes += 1
        interval_us = 0  # the time per save since the last background vote: 0 if unknown
        if background:
            now = time.monotonic()
            if self._voted_at is not None and self._saves_since_vote:
                interval_us = int((now - self._voted_at) / self._saves_since_vote * 1e6)
            self._voted_at = now
        return [
            int(busy),
            int(preempted),
            int(self._too_soon()),
            interval_us,
            self.proposed_full_copy_every,
        ]

    def started(self, step: int) -> None:
        """A persist of the snapshot of `step` is reserved in the slot table."""
        self.last_started = step
        self._last_started_at = time.monotonic()
        self._stats.persists += 1

    def _too_soon(self) -> bool:
        at, gap = self._last_started_at, self.config.persist_interval
        if at is None:
            return False
        if gap is None:  # auto: a quarter of the time at most, by the last persist's duration
            took = self._stats.last_persist_s
            gap = 0.0 if took is None else took / AUTO_DUTY
        return time.monotonic() - at < gap

    def send(
        self,
        step: int,
        index: int,
        entries: list[TensorEntry],
        objects: bytes,
        plan: dcp_layout.StoragePlan,
    ) -> None:
        """Tell the worker to persist the snapshot of `step` in slot `index`."""
        self.client.send(
            persist_message(
                step=step,
                rank=self._comm.rank,
                world_size=self._comm.world,
                slot_path=self._tier.slots[index].path,
                entries=entries,
                objects=objects,
                plan=plan,
                config=self.config,
                nonce=self._nonce,
            )
        )

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no persist is in flight on this rank; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._slots.persisting, timeout)

    def persist_last(self, last_saved: int | None, timeout: float) -> None:
        """Collective: persist the latest snapshot if the last save was not persisted."""
        # Agreed by all ranks, so that they all take part in the same collectives.
        need, gone = self._comm.max_ints(
            [
                int(last_saved is not None and last_saved != self.last_started),
                int(self._slots.worker_gone),
            ]
        )
        if not need or gone:
            return
        # Past this point every rank's worker is idle, or no rank persists.
        (busy,) = self._comm.max_ints([int(not self.wait_idle(timeout))])
        if busy:
            warn(
                f"step {last_saved} is not persisted: a persist "
                f"was still in flight after {timeout} s"
            )
        else:
            self._persist_latest()

    def _persist_latest(self) -> None:
        index = self._slots.latest
        state = self._tier.states[index] if index is not None else None
        if index is None or state is None or state.step is None:
            return
        slot = self._tier.slots[index]
        tensors = {e.key: slot.view(e) for e in state.entries}
        sig = signature(state.entries, self._comm.world)
        if self.plan is None or self.plan.signature != sig:
            self.plan = dcp_layout.plan_storage(
                tensors, comm=self._comm, signature=sig, key=self.config.hmac_key
            )
        del tensors
        with self._cond:
            if self._slots.worker_gone:
                raise worker_died()
            self._slots.pin_latest()
        self.started(state.step)
        self.send(state.step, index, state.entries, state.objects, self.plan)

    def _on_message(self, msg: dict[str, Any]) -> None:
        """Runs on the reply-reader thread."""
        with self._cond:
            if msg["op"] == "released":
                self._slots.released()
            elif msg["op"] == "done":
                self._slots.persist_done()
                if self._last_started_at is not None:
                    self._stats.last_persist_s = time.monotonic() - self._last_started_at
                if msg["ok"]:
                    self._stats.persisted += 1
                    self._stats.last_persisted_step = msg["step"]
                    if self._comm.rank == 0:  # rank 0's persist is the commit (manifest renamed)
                        runtime.checkpoint_committed(msg["step"])
                elif msg.get("superseded"):  # a zombie: the next save() raises
                    self._stats.persist_failures += 1
                    self.superseded = msg["error"]
                else:
                    self._stats.persist_failures += 1
                    warn(f"persisting step {msg['step']} failed: {msg['error']}")
            elif msg["op"] == "exited":
                self._slots.worker_exited()
                if not self._closing:
                    warn(f"the persist worker exited (code {msg['code']})")
            self._cond.notify_all()

    def close(self, timeout_s: float) -> None:
        """Stop the worker (a persist still in flight is abandoned). Idempotent."""
        self._closing = True
        self.client.close(timeout_s=timeout_s)


def worker_died() -> CheckpointError:
    return CheckpointError(
        "the checkpoint persist worker died", hint="see this rank's log for its error"
    )
