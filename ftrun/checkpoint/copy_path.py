"""The Manager's copy path: a save copied into a slot in the background, then committed.

save() takes references to the state's tensors (clones of the small ones, which a forward pass
may update) and queues the copy; the snapshot thread (snapshot.py) copies them into the slot the
slot table gave the save while the next forward and backward run, and as the last chunk lands
the guard (guard.py) compares the tensors' version counters: a tensor that changed in between
and the copy is not committed (`_torn`). A complete copy is committed here, on the snapshot
thread: the slot's manifest written (the memory tier's commit), the fence released, the slot
filled in the slot table, and, when the save is persisted, the "persist" command sent to the
worker (persister.py). The optimizer's pre-step hook waits for the copy (`wait_copied`),
taking the remaining chunks itself rather than idle.

Every save that does not take the live path (live_path.py) takes this one: every save without a
live snapshot, a persisted save, and the live snapshot's full copies (its fallback).

A rank never writes over the newest step every rank of its host has completed (`make_room`):
each commit records the step in the tier (host_progress.py), and a save whose slot holds a step
that another rank of the host has not yet got past waits until it has (docs/checkpoint.md, *Two
slots or three*).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial

import torch

from ftrun.checkpoint import dcp_layout, device_copy, guard, host_progress
from ftrun.checkpoint.capacity import Capacity
from ftrun.checkpoint.config import CheckpointConfig
from ftrun.checkpoint.errors import CheckpointError
from ftrun.checkpoint.generation_claim import GenerationClaim
from ftrun.checkpoint.persister import Persister, worker_died
from ftrun.checkpoint.restore import warn
from ftrun.checkpoint.slot_file import Slot
from ftrun.checkpoint.slot_layout import layout
from ftrun.checkpoint.slot_table import COPYING_PHASES, SlotTable
from ftrun.checkpoint.slots import MemoryTier
from ftrun.checkpoint.snapshot import SnapshotJob, Snapshotter
from ftrun.checkpoint.snapshot_meta import SnapshotMeta
from ftrun.checkpoint.stats import Stats

Commit = Callable[[int, SnapshotMeta], None]  # write a slot's manifest (the Manager's _commit)
# make_room() reads the host's records again after the first pause, doubled up to the second.
POLL_S = (0.0005, 0.01)


class CopyPath:
    """The copies of one Manager into its slots; `job` is the last one queued."""

    def __init__(
        self,
        config: CheckpointConfig,
        *,
        tier: MemoryTier,
        table: SlotTable,
        cond: threading.Condition,
        persister: Persister,
        capacity: Capacity,
        guard: guard.Guard,
        claim: GenerationClaim,
        stats: Stats,
        commit: Commit,
        on_full_copy: Callable[[float], None],
    ) -> None:
        self._config = config
        self._tier, self._slots, self._cond = tier, table, cond
        self._persister, self._capacity = persister, capacity
        self._guard, self._claim, self._stats = guard, claim, stats
        self._commit, self._on_full_copy = commit, on_full_copy
        self.snapshotter = Snapshotter(timeout_s=config.snapshot_timeout)  # the copy's thread
        self.job: SnapshotJob | None = None
        self._touched = False  # the slots were restored from, or invalidated: none is stale

    def restored(
        self, step: int, latest: int | None, keyed: list[tuple[str, torch.Tensor]]
    ) -> None:
        """restore() loaded `step` (from slot `latest` of the table, or not from one): the
        slots' newer snapshots are another timeline; ready the buffers while training starts."""
        with self._cond:
            self._slots.restored(self._tier.keep_until(step), latest=latest)
            self._touched = True
        self._tier.record(step)  # nothing older is needed: each rank holds `step`, or none does
        _, size = layout(keyed)
        gpus = device_copy.devices(t for _, t in keyed)
        self.job = SnapshotJob(
            step,
            None,
            size,
            [],
            None,
            prepare=self._tier.slots,
            device=gpus[0] if gpus else None,
        )
        self.snapshotter.submit(self.job)

    def take_slot(self, step: int, *, persist: bool, copy: bool) -> tuple[int, bool]:
        """save(), holding the tier's claim: the slot the copy of `step` goes into (`copy`; else
        the live one) and whether it is persisted (not if the worker died just now). A first
        save without a restore invalidates the slots first: their snapshots are stale."""
        with self._cond:
            if not self._touched:
                self._tier.invalidate_all()
                self._touched = True
            if not copy:
                return self._tier.live_index, False
            persist = persist and not self._slots.worker_gone
            index = self._slots.start_snapshot(persist=persist)
            self._tier.invalidate(index)
            if persist:
                self._persister.started(step)
            return index, persist

    def make_room(self, *, copy: bool) -> None:
        """Before a save that copies into a slot (`copy`): wait while the slot it takes holds a
        step that another rank of this host has not got past (host_progress.py), so that the
        newest step every rank has completed stays in the tier. In data parallel the others are
        a copy behind at most, complete by their next optimizer step: this waits only while a
        persist pins a slot (or with two slots), for part of their step. After
        `snapshot_timeout` (a rank that stopped) the save goes on, and says so."""
        run = self._tier.run
        if not (copy and self._tier.kept and run):
            return
        started, pause = time.monotonic(), POLL_S[0]
        while True:
            with self._cond:
                step = self._slots.overwrites()
            if step is None:  # an empty slot, or the latest (two slots, one pinned)
                break
            done = host_progress.steps(self._tier.directory, run=run)
            done.pop(self._tier.rank, None)  # its own newest step is its latest
            behind = host_progress.behind(done, step)
            if not behind:
                break
            if time.monotonic() - started >= self._config.snapshot_timeout:
                warn(
                    f"rank {self._tier.rank}: the snapshot of step {step} is written over, though "
                    f"rank(s) {', '.join(map(str, behind))} of this host did not complete a newer "
                    f"one in {self._config.snapshot_timeout} s: a restart may not find in memory "
                    "a step every rank holds"
                )
                break
            time.sleep(pause)
            pause = min(2 * pause, POLL_S[1])
        self._stats.host_wait_s += time.monotonic() - started

    def forget_slots(self) -> None:
        """The copy slots left the tier root (capacity.py): their snapshots are forgotten, once
        the worker has let go of them."""
        self._persister.wait_idle(self._config.persist_timeout)
        with self._cond:
            self._slots.restored([None] * len(self._tier.slots), latest=None)

    def retire(self, index: int) -> bool:
        """The tier has no room for slot `index` (capacity.py): saves stop using it."""
        with self._cond:
            return self._slots.retire(index)

    def start(
        self,
        meta: SnapshotMeta,
        keyed: list[tuple[str, torch.Tensor]],
        index: int,
        *,
        gpus: list[torch.device],
        persist: bool,
    ) -> None:
        """Queue the copy of `keyed` into slot `index` (the tier's claim is held until it is
        committed or failed); persisted once committed if `persist`."""
        small = self._config.small_tensor_bytes
        size = meta.layout.size
        copies = [
            (t.clone() if e.nbytes <= small else t, e)
            for (_, t), e in zip(keyed, meta.layout.entries, strict=True)
        ]
        others = [
            s for s in self._tier.slots if s.index != index and (s.size < size or not s.populated)
        ]
        ready = device_copy.mark_ready(gpus) if gpus else None  # after the clones, on each GPU
        watch = None if gpus else guard.versions((e.key, t) for t, e in copies if e.nbytes > small)
        plan = self._persister.plan if persist else None
        self.job = SnapshotJob(
            meta.step,
            self._tier.slots[index],
            size,
            copies,
            partial(self._done, meta, index, plan),
            prepare=others,
            on_failure=partial(self._failed, index),
            ready=ready,
            guard=watch,
            on_changed=partial(self._torn, meta.step, index),
        )
        self.snapshotter.submit(self.job)

    # -- on the snapshot thread ----------------------------------------------------------------

    def _done(self, meta: SnapshotMeta, index: int, plan: dcp_layout.StoragePlan | None) -> None:
        """The copy is complete: commit it, and send it to the worker if it is persisted."""
        try:
            self._commit(index, meta)
        finally:
            self._claim.release()
        with self._cond:
            send = self._slots.filled(index, meta.step)
        if send:
            assert plan is not None
            self._persister.send(meta.step, index, meta.layout.entries, meta.objects, plan)
        elif plan is not None:  # the worker exited during the copy
            raise worker_died()

    def _torn(self, step: int, index: int, name: str) -> None:
        """`name` changed before its copy was complete: not committed."""
        self._failed(index)
        self._guard.trip(f"{name} changed while the snapshot of step {step} was copied")

    def _failed(self, index: int) -> None:
        """The copy into `index` or its commit failed."""
        self._claim.release()
        with self._cond:
            if self._slots.phase(index) in COPYING_PHASES:  # not when only the persist send failed
                self._slots.copy_failed(index)
            self._cond.notify_all()

    # -- waiting -------------------------------------------------------------------------------

    def wait_copied(self, timeout: float | None = None) -> None:
        """Block until the last copy is complete, helping it: from then on the state may change."""
        job = self.job
        if job is None:
            return
        limit = self._config.snapshot_timeout if timeout is None else timeout
        if not job.copied.is_set():
            t0 = time.perf_counter()
            finished = job.help(limit)  # copy the remaining chunks here rather than idle
            blocked = time.perf_counter() - t0
            self._stats.blocked_s += blocked
            job.held_s += blocked
            if not finished:
                raise CheckpointError(
                    f"the snapshot of step {job.step} did not finish within {limit} s",
                    hint="is /dev/shm or memory exhausted? see the rank's log",
                )
        if job.error is not None:
            self.job = None
            what = f"the snapshot of step {job.step}"  # no room in the tier: a level down
            if job.done.wait(limit) and self._capacity.absorb(job.error, what):
                return
            if isinstance(job.error, CheckpointError):
                raise job.error
            raise CheckpointError(
                f"the snapshot of step {job.step} failed: {job.error!r}"
            ) from job.error

    def wait_done(self) -> None:
        """The copy is done and so is its bookkeeping (manifest, persist command): ms later."""
        self.wait_copied()
        job = self.job
        if job is not None:
            if not job.done.wait(self._config.snapshot_timeout):
                raise CheckpointError(f"the snapshot of step {job.step} did not commit in time")
            self.job = None
            if job.slot is not None:
                self._on_full_copy(job.held_s)
            if job.error is not None and not self._capacity.absorb(job.error, f"step {job.step}"):
                raise CheckpointError(
                    f"the snapshot of step {job.step} failed: {job.error!r}"
                ) from job.error

    def wait_ready(self, timeout: float | None = None) -> bool:
        """The last copy is done and the slots are allocated and faulted in (in the background
        after restore() and the first save()); False on timeout."""
        self.wait_done()
        limit = self._config.snapshot_timeout if timeout is None else timeout
        return self.snapshotter.wait_idle(limit)

    # -- close() -------------------------------------------------------------------------------

    def copy_now(self, meta: SnapshotMeta, source: Slot) -> None:
        """Copy the snapshot in `source` (the live slot) into a slot and commit it there, on
        this thread, holding the tier's claim: the snapshot of `meta.step` from now on."""
        size = meta.layout.size
        self.make_room(copy=True)
        self._claim.acquire()
        try:
            with self._cond:
                index = self._slots.start_snapshot(persist=False)
                self._tier.invalidate(index)
            slot = self._tier.slots[index]
            try:
                try:
                    slot.ensure(size)
                except CheckpointError as exc:  # no room: persisted from anonymous memory
                    self._capacity.rescue(slot, size, exc)
                slot.populate()
                assert slot.base is not None and source.base is not None
                slot.base[:size].copy_(source.base[:size])
                self._commit(index, meta)
            except BaseException:
                with self._cond:
                    self._slots.copy_failed(index)
                raise
            with self._cond:
                self._slots.filled(index, meta.step)
        finally:
            self._claim.release()
