"""Manager: the object a training script holds. Snapshot, persist, restore.

This module is the public API and the order of things in one rank. The rules live elsewhere:
which slot a save writes into, which one the worker reads and when a persist may start are the
pure `slot_table.SlotTable`; the copy is `snapshot.py`; the worker and its messages are
`persist_client.py`; which saves are persisted, agreed by all ranks, is `persister.py`; the tier
choice is `restore.py`; the live snapshot, which keeps the state in the memory tier so that most
saves copy next to nothing, is `live.py`. Per rank: a snapshot thread (copies tensors
into a slot while the next forward/backward runs), a persist worker process (writes a slot to
storage at idle priority) and its reply-reader thread; they meet in the slot table, under `_cond`.

    save(step)  ── references + small copies ──▶ snapshot thread ── memcpy ──▶ slot (memory tier)
                                                                   └─ persist? ─▶ worker ─▶ storage
    next optimizer.step() ─ pre-step hook ─▶ wait_snapshot() (blocks only if the copy is not done;
                                             GPU tensors: the training stream waits, not the thread)

Every save reaches the memory tier; at most one persist is in flight, at no more than
`persist_bandwidth` MB/s (on the reference VM, unthrottled writes at 1-2 GB/s slow training by
10-100%, 300 MB/s by a few %). All ranks agree whether a save is persisted (one all-reduce).
"""

from __future__ import annotations

import collections
import os
import statistics
import threading
import time
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ftrun import runtime
from ftrun.checkpoint import (
    capacity,
    dcp_layout,
    device_copy,
    guard,
    live,
    slots,
    stale_ranks,
    storage,
)
from ftrun.checkpoint import restore as restore_mod
from ftrun.checkpoint.comm import Comm
from ftrun.checkpoint.config import CheckpointConfig, resolve_config
from ftrun.checkpoint.errors import CheckpointError
from ftrun.checkpoint.fence import FENCE_TIMEOUT_S, GenerationFence, Superseded
from ftrun.checkpoint.persist_client import PersistClient
from ftrun.checkpoint.persister import Persister, worker_died
from ftrun.checkpoint.restore import warn
from ftrun.checkpoint.slot_table import COPYING_PHASES, SlotTable
from ftrun.checkpoint.snapshot import SnapshotJob, Snapshotter
from ftrun.checkpoint.state import TrainState, apply, flatten, keyed_tensors, pickle_objects
from ftrun.checkpoint.stats import Stats

SECTION_SLACK_S = 60.0
# Rank 0 tells the agent its checkpoint stall so far at most this often: each datagram wakes
# the agent, which on a busy host costs the sender ~0.5 ms (the agent forwards it every 0.5 s).
STALL_REPORT_INTERVAL_S = 0.25


class Manager:
    """Checkpoints for one training run; see docs/checkpoint.md.

    mgr = Manager()                       # $FTRUN_JOB_DIR/checkpoints, or ./checkpoints
    state = {"train": TrainState(model, opt), "data": PerRank(loader)}
    start = mgr.restore(state)            # 0 when there is no checkpoint
    for step in range(start + 1, steps + 1):
        ...; opt.step()
        mgr.save(step, state)
    mgr.close()
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        config: CheckpointConfig | None = None,
        **options: Any,
    ) -> None:
        self.config = (config or resolve_config(directory, **options)).with_key()
        self._closed = True  # until fully constructed
        storage.prepare_directory(self.config.directory)
        self._comm = Comm(timeout_s=self.config.collective_timeout)
        rank, world = self._comm.rank, self._comm.world
        nonce: str = self._comm.broadcast(uuid.uuid4().hex[:8])
        # Without a tier (none, refused, no room): anonymous slots, storage only (capacity.py).
        self._tier = capacity.open_tier(self.config, rank=rank, world=world)
        mem = self.config.memory_dir if self._tier.persistent else None
        # Claim both directories for this generation before reading either (fence.py): from now
        # on a rank of an older generation, a zombie of a lost host, can publish nothing there.
        owner = self.config.owner
        try:
            try:
                self._memory_fence = self._claim(mem, owner) if mem and owner else None
            except OSError as exc:  # no room for the fence's file: no tier (capacity.py)
                self._tier = capacity.leave_tier(self._tier, self.config, exc, world=world)
                self._memory_fence = None
            if owner:
                self._claim(self.config.directory, owner).close()
            if self._memory_fence is not None and self._tier.directory is not None:
                try:
                    stale_ranks.claim_rank_dir(self._tier.directory, self._memory_fence.mine)
                except OSError as exc:  # only costs memory: the agent removes it at job end
                    warn(f"the memory tier directory {self._tier.directory} is not claimed: {exc}")
        except BaseException:
            self._tier.close()
            self._comm.close()
            raise
        self._cond = threading.Condition()
        self._slots = SlotTable(self.config.memory_slots)  # guarded by _cond
        self._capacity = capacity.Capacity(
            self._tier,
            root=self.config.memory_root,
            copies=self.config.memory_slots,
            live=self.config.live_snapshot,
            on_leave=self._leave_level,
            on_retire=self._retire_slot,
        )
        self._job: SnapshotJob | None = None
        self._last_saved: int | None = None
        self._hooks: dict[int, Any] = {}
        self._touched_slots = False
        self._layout: tuple[Any, list[slots.TensorEntry], int, str] | None = None  # the last one
        self._live: live.LiveSnapshot | None = None  # the state adopted into the tier (live.py)
        self._live_refused: str | None = None  # the layout whose adoption found nothing to move
        self._guard = guard.Guard(rank=rank)  # a change outside the fence seen: copy in save()
        self._saved_at: float | None = None  # the last save (time.perf_counter())
        # The last times between saves: their median is the time per save a full copy is
        # weighed against (a pause for an evaluation does not count).
        self._save_gaps: collections.deque[float] = collections.deque(maxlen=9)
        self._stall_reported_at = 0.0
        self._preempt_pending = self.config.preempt_file is not None
        self.restored: restore_mod.Restored | None = None
        self.stats = Stats()
        self._snapshotter = Snapshotter(timeout_s=self.config.snapshot_timeout)
        try:
            self._persister = Persister(
                self.config,
                comm=self._comm,
                tier=self._tier,
                table=self._slots,
                cond=self._cond,
                stats=self.stats,
                nonce=nonce,
            )
        except BaseException:
            self._snapshotter.close(timeout=10.0)
            self._tier.close()
            self._release_memory_fence()
            if self._memory_fence is not None:
                self._memory_fence.close()
            self._comm.close()
            raise
        if self.config.full_copy_every is not None:
            every = self.config.full_copy_every  # the same on every rank: no vote needed
            self._persister.proposed_full_copy_every = self._persister.full_copy_every = every
        # Rank directories an older generation left on this host (stale_ranks.py): set aside
        # at the first save after this rank's first persist.
        self._stale_ranks_pending = self._memory_fence is not None
        self._stale_ranks_removal: threading.Thread | None = None
        self._closed = False

    def _claim(self, directory: os.PathLike[str], owner: str) -> GenerationFence:
        fence = GenerationFence(
            Path(directory),
            job=owner,
            generation=self.config.generation,
            timeout_s=FENCE_TIMEOUT_S,
        )
        try:
            fence.advance()
        except BaseException:
            fence.close()
            raise
        return fence

    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def world_size(self) -> int:
        return self._comm.world

    @property
    def _worker_gone(self) -> bool:  # read by tests
        return self._slots.worker_gone

    @property
    def _client(self) -> PersistClient:  # read by tests
        return self._persister.client

    # -- restore -------------------------------------------------------------------------------

    def restore(self, state: Mapping[str, Any]) -> int:
        """Load the freshest valid checkpoint into `state` (in place); returns its step, 0 if none.

        Collective: every rank calls it. `self.restored` tells the step, tier and path.
        """
        self._check_open()
        self._wait_done()
        if self._live is not None:  # loading into the adopted tensors changes them
            self._live.retract()
        t0 = time.perf_counter()
        flat = flatten(state)
        self.attach(*flat.optimizers())
        restored, objects, slot_index = restore_mod.restore(
            flat, comm=self._comm, tier=self._tier, config=self.config
        )
        apply(flat, objects)
        if slot_index == self._tier.live_index:  # not one of the slot table's
            slot_index = None
        with self._cond:
            self._slots.restored(self._tier.keep_until(restored.step), latest=slot_index)
            self._touched_slots = True
        keyed = keyed_tensors(flat, self.rank)
        _, size = slots.layout(keyed)
        gpus = device_copy.devices(t for _, t in keyed)
        self._job = SnapshotJob(
            restored.step,
            None,
            size,
            [],
            None,
            prepare=self._tier.slots,
            device=gpus[0] if gpus else None,
        )
        self._snapshotter.submit(self._job)  # ready the buffers while training starts
        self.restored = restored
        if self.rank == 0:
            runtime.checkpoint_restored(
                restored.step, restored.tier, time.perf_counter() - t0, restored.skipped
            )
        return restored.step

    # -- save ----------------------------------------------------------------------------------

    def save(self, step: int, state: Mapping[str, Any]) -> None:
        """Snapshot `state` as of `step`; returns once the copy is queued (milliseconds).

        Collective: every rank calls it with the same step. The state's tensors must not change
        until the copy is done: the next optimizer step waits for it automatically (TrainState
        optimizers, or `attach(opt)`); otherwise call wait_snapshot() first.
        """
        t0 = time.perf_counter()
        self._check_open()
        self._time_save(t0)
        self._wait_done()
        if self._live is not None and self._live.check():  # (the guard, live.py)
            self._live.retract()  # this save writes into the live slot, or leaves it behind
        if self._slots.worker_gone:
            raise worker_died()
        if self._persister.superseded:  # the worker's commit was refused: we are a zombie
            raise Superseded(self._persister.superseded)
        self._capacity.check()  # a write into the tier found no room: one level down
        flat = flatten(state, saving=True)
        self.attach(*flat.optimizers())
        keyed = keyed_tensors(flat, self.rank)
        entries, size, sig = self._layout_of(keyed)
        objects = pickle_objects(flat, key=self.config.hmac_key)
        flag = self.config.preempt_file
        preempted = self._preempt_pending and flag is not None and flag.exists()
        persist, urgent = self._persister.wanted(step, keyed, sig, preempted=preempted)
        gpus = device_copy.devices(t for _, t in keyed)
        # Every slot reserved before the state is adopted or copied, or the tier steps down.
        self._capacity.reserve(size, wait_idle=partial(self.wait_ready, None))
        adopted = not gpus and self._adopt(flat, keyed, entries, size, sig)
        copy_all = (
            persist
            or adopted  # the first full copy: the restore's fallback from then on
            or self._live is None
            or self._live.disabled is not None
            or self.stats.saves % self._persister.full_copy_every == 0
        )
        if self._memory_fence is not None:
            # Held until the slot's manifest is written (_snapshot_done) or the copy failed: a
            # newer generation cannot claim the tier while this rank writes into it.
            self._memory_fence.acquire()
        try:
            if self._stale_ranks_pending and self.stats.persisted:
                self._remove_stale_ranks()
            with self._cond:
                if not self._touched_slots:  # saving without a restore: old snapshots are stale
                    self._tier.invalidate_all()
                    self._touched_slots = True
                if not copy_all:
                    index = self._tier.live_index
                else:
                    persist = persist and not self._slots.worker_gone  # it may have died just now
                    index = self._slots.start_snapshot(persist=persist)
                    self._tier.invalidate(index)
                    if persist:
                        self._persister.started(step)
        except BaseException:
            self._release_memory_fence()
            raise
        small = self.config.small_tensor_bytes
        if not copy_all:
            assert self._live is not None
            self._save_live(self._live, step, keyed, entries, size, sig, objects)
            self.stats.live_saves += 1
            self._saved(step, t0)
            return
        copies = [
            (t.clone() if e.nbytes <= small else t, e)
            for (_, t), e in zip(keyed, entries, strict=True)
        ]
        others = [
            s for s in self._tier.slots if s.index != index and (s.size < size or not s.populated)
        ]
        ready = device_copy.mark_ready(gpus) if gpus else None  # after the clones, on each GPU
        watch = None if gpus else guard.versions((e.key, t) for t, e in copies if e.nbytes > small)
        finish = partial(
            self._snapshot_done,
            step,
            index,
            sig,
            entries,
            objects,
            size,
            self._persister.plan if persist else None,
        )
        self._job = SnapshotJob(
            step,
            self._tier.slots[index],
            size,
            copies,
            finish,
            prepare=others,
            on_failure=partial(self._snapshot_failed, index),
            ready=ready,
            guard=watch,
            on_changed=partial(self._torn, step, index),
        )
        self._snapshotter.submit(self._job)
        if self._guard.tripped:  # copied (the training thread helps) and committed on return
            self._wait_done()
        self._saved(step, t0)
        if urgent:
            self._persist_for_preemption(step, persisted=persist)

    def _saved(self, step: int, t0: float) -> None:
        """save()'s bookkeeping, once the snapshot of `step` is committed or queued."""
        self._last_saved = step
        self.stats.saves += 1
        self.stats.save_s += time.perf_counter() - t0
        if self.rank == 0:
            self._report_stall()

    def _save_live(
        self,
        snap: live.LiveSnapshot,
        step: int,
        keyed: list[tuple[str, torch.Tensor]],
        entries: list[slots.TensorEntry],
        size: int,
        sig: str,
        objects: bytes,
    ) -> None:
        """Holding the memory fence: commit the live snapshot of `step` before returning, so a
        rank that dies at any moment after save() restores this step (~1.5 ms for 768 tensors
        here). What the file does not keep live (buffers, a channels_last or shared tensor, an
        EMA module) is copied in first, here: a copy left to the background thread may not be
        done before the next optimizer step takes the snapshot back (issue 33)."""
        try:
            for (_, t), e in zip(keyed, entries, strict=True):
                if e.key not in snap.keys:
                    snap.slot.view(e).copy_(t)
            self._commit(self._tier.live_index, step, sig, entries, objects, size)
            snap.committed_as(step, sig, entries, objects, size)
        except OSError as exc:  # the commit's files (a full /dev/shm)
            raise CheckpointError(
                f"the live snapshot of step {step} could not be written: {exc}",
                hint="is /dev/shm full? see docs/checkpoint.md, Memory bound",
            ) from exc
        finally:
            self._release_memory_fence()

    def _time_save(self, t0: float) -> None:
        if self._saved_at is not None:
            self._save_gaps.append(t0 - self._saved_at)
        self._saved_at = t0

    def _adopt(
        self,
        flat: Any,
        keyed: list[tuple[str, torch.Tensor]],
        entries: list[slots.TensorEntry],
        size: int,
        sig: str,
    ) -> bool:
        """Move the state into the live slot (live.py) when it is not there for this layout;
        True if it moved now. Off without the memory tier, and for GPU state."""
        if not self.config.live_snapshot or self._tier.live is None or not self._capacity.live:
            return False
        if self._live is not None and (
            self._live.disabled is not None
            or (self._live.sig == sig and self._live.holds(keyed, entries))
        ):
            return False
        if self._live_refused == sig:
            return False
        previous, self._live = self._live, None
        if previous is not None:  # the layout or the tensors changed: into a fresh file
            previous.retract()
            previous.unhook()  # its forward pre-hooks (live.py) go with it
        if self._memory_fence is not None:  # a zombie must not replace the live file
            self._memory_fence.acquire()
        try:
            roots = [obj for obj, _ in flat.roots if isinstance(obj, TrainState)]
            self._live = live.LiveSnapshot.adopt(
                self._tier, keyed, entries, size, sig, roots, previous
            )
        except CheckpointError as exc:  # e.g. /dev/shm too small for one more copy
            self._live = None
            if slots.is_full(exc):
                self._capacity.step_down(capacity.Level.COPIES, str(exc))
            else:
                warn(f"the live snapshot is off, every save copies the state: {exc}")
        finally:
            self._release_memory_fence()
        if self._live is None:
            self._live_refused = sig
            return False
        self._live.on_change = partial(self._guard.trip, before="live")
        return True

    def _layout_of(
        self, keyed: list[tuple[str, torch.Tensor]]
    ) -> tuple[list[slots.TensorEntry], int, str]:
        """The slot layout of these tensors and its signature: the last save's while the names,
        dtypes and shapes are the same (they are, save after save)."""
        key = [(name, t.dtype, t.shape) for name, t in keyed]
        if self._layout is not None and self._layout[0] == key:
            _, entries, size, sig = self._layout
            return entries, size, sig
        entries, size = slots.layout(keyed)
        sig = slots.signature(entries, self.world_size)
        self._layout = (key, entries, size, sig)
        return entries, size, sig

    def _report_stall(self, *, final: bool = False) -> None:
        """What checkpoints cost the training loop so far (goodput's bucket), to the agent."""
        now = time.monotonic()
        if final or now - self._stall_reported_at >= STALL_REPORT_INTERVAL_S:
            self._stall_reported_at = now
            runtime.checkpoint_stall(self.stats.save_s + self.stats.blocked_s)

    def _persist_for_preemption(self, step: int, *, persisted: bool) -> None:
        """The job got a preemption notice: wait until this save is committed to storage (it
        is about to be stopped, and requeued), then tell the agent, so the controller stops the
        job knowing what was kept. Once per notice; training goes on until it is stopped."""
        self._preempt_pending = False
        if not persisted:
            warn(f"step {step} is not persisted for the preemption: the worker is gone or busy")
            return
        done = self.wait_persist()
        if self.rank == 0 and done and self.stats.last_persisted_step == step:
            runtime.checkpoint_committed(step, preempt=True)

    def _snapshot_done(
        self,
        step: int,
        index: int,
        sig: str,
        entries: list[slots.TensorEntry],
        objects: bytes,
        size: int,
        plan: dcp_layout.StoragePlan | None,
    ) -> None:
        """Runs on the snapshot thread once the copy is complete."""
        try:
            self._commit(index, step, sig, entries, objects, size)
        finally:
            self._release_memory_fence()
        with self._cond:
            send = self._slots.filled(index, step)
        if send:
            assert plan is not None
            self._persister.send(step, index, entries, objects, plan)
        elif plan is not None:  # the worker exited during the copy
            raise worker_died()

    def _torn(self, step: int, index: int, name: str) -> None:
        """Snapshot thread: `name` changed before its copy was complete: not committed."""
        self._snapshot_failed(index)
        self._guard.trip(f"{name} changed while the snapshot of step {step} was copied")

    def _snapshot_failed(self, index: int) -> None:
        """Runs on the snapshot thread when the copy into `index` or its commit failed."""
        self._release_memory_fence()
        with self._cond:
            if self._slots.phase(index) in COPYING_PHASES:  # not when only the persist send failed
                self._slots.copy_failed(index)
            self._cond.notify_all()

    def _commit(
        self,
        index: int,
        step: int,
        sig: str,
        entries: list[slots.TensorEntry],
        objects: bytes,
        size: int,
    ) -> None:
        """Write the manifest of the snapshot of `step` in slot `index` (the live one too)."""
        self._tier.commit(
            index,
            step=step,
            generation=self.config.generation,
            sig=sig,
            entries=entries,
            objects=objects,
            data_size=size,
        )

    def _leave_level(self, level: capacity.Level, drop_slots: bool) -> None:
        """The tier steps down (capacity.py): below LIVE the tensors go back to the heap; slots
        that leave the tier root are forgotten, once the worker has let go of them."""
        if self._live is not None and level < capacity.Level.LIVE:
            self._tier.invalidate(self._tier.live_index)
            self._live.give_back()
            self._live = None
        if drop_slots:
            self._persister.wait_idle(self.config.persist_timeout)
            with self._cond:
                self._slots.restored([None] * len(self._tier.slots), latest=None)

    def _retire_slot(self, index: int) -> bool:
        """The tier has no room for slot `index` (capacity.py): saves stop using it."""
        with self._cond:
            return self._slots.retire(index)

    def _release_memory_fence(self) -> None:
        if self._memory_fence is not None:
            self._memory_fence.release()

    # -- waiting -------------------------------------------------------------------------------

    def wait_snapshot(self, timeout: float | None = None) -> None:
        """Block until the last save's copy is complete (the optimizer pre-step hook calls this):
        from then on the state may change."""
        self._wait_snapshot(timeout)
        if self._live is not None and self._live.check():  # (the guard, live.py)
            self._live.retract()  # the state may change from here: not a snapshot any more

    def _wait_snapshot(self, timeout: float | None = None) -> None:
        job = self._job
        if job is None:
            return
        limit = self.config.snapshot_timeout if timeout is None else timeout
        if not job.copied.is_set():
            t0 = time.perf_counter()
            finished = job.help(limit)  # copy the remaining chunks here rather than idle
            blocked = time.perf_counter() - t0
            self.stats.blocked_s += blocked
            job.held_s += blocked
            if not finished:
                raise CheckpointError(
                    f"the snapshot of step {job.step} did not finish within {limit} s",
                    hint="is /dev/shm or memory exhausted? see the rank's log",
                )
        if job.error is not None:
            self._job = None
            what = f"the snapshot of step {job.step}"  # no room in the tier: a level down
            if job.done.wait(limit) and self._capacity.absorb(job.error, what):
                return
            if isinstance(job.error, CheckpointError):
                raise job.error
            raise CheckpointError(
                f"the snapshot of step {job.step} failed: {job.error!r}"
            ) from job.error

    def _wait_done(self) -> None:
        """The copy is done and so is its bookkeeping (manifest, persist command): ms later."""
        self._wait_snapshot()
        job = self._job
        if job is not None:
            if not job.done.wait(self.config.snapshot_timeout):
                raise CheckpointError(f"the snapshot of step {job.step} did not commit in time")
            self._job = None
            if (
                job.slot is not None
                and self._live is not None
                and self.config.full_copy_every is None
            ):
                # How long this full copy held the optimizer step up decides how far apart the
                # next are (save() itself costs the same whether it copies or not).
                gap = statistics.median(self._save_gaps) if self._save_gaps else 0.0
                self._persister.proposed_full_copy_every = live.full_copy_every(job.held_s, gap)
            if job.error is not None and not self._capacity.absorb(job.error, f"step {job.step}"):
                raise CheckpointError(
                    f"the snapshot of step {job.step} failed: {job.error!r}"
                ) from job.error

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the snapshot buffers are allocated and faulted in (done in the background
        after restore() and the first save(); a benchmark calls this to leave warm-up out)."""
        self._wait_done()
        return self._snapshotter.wait_idle(
            self.config.snapshot_timeout if timeout is None else timeout
        )

    def wait_persist(self, timeout: float | None = None) -> bool:
        """Wait until no persist is in flight on this rank; False on timeout."""
        limit = self.config.persist_timeout if timeout is None else timeout
        with _no_steps("checkpoint persist", limit):
            return self._wait_persist(limit)

    def _wait_persist(self, limit: float) -> bool:
        self._wait_done()
        return self._persister.wait_idle(limit)

    def attach(self, *optimizers: torch.optim.Optimizer) -> None:
        """Make each optimizer's step() wait for the snapshot copy first (a pre-step hook)."""
        for opt in optimizers:
            if id(opt) not in self._hooks:
                self._hooks[id(opt)] = opt.register_step_pre_hook(
                    lambda _opt, _args, _kwargs: self.wait_snapshot()
                )

    # -- shutdown ------------------------------------------------------------------------------

    def close(self, *, persist_last: bool = True, timeout: float | None = None) -> None:
        """Persist the last snapshot if it was not (collective), wait for it, stop. Idempotent."""
        if self._closed:
            return
        limit = self.config.persist_timeout if timeout is None else timeout
        try:
            with _no_steps("checkpoint close", limit):
                self._wait_done()
                self._copy_live_into_slot()
                if self.rank == 0 and self.stats.saves:
                    self._report_stall(final=True)
                if persist_last:
                    self._persister.persist_last(self._last_saved, limit)  # collective
                if not self._wait_persist(limit):
                    restore_mod.warn(f"the last persist did not finish within {limit} s")
        finally:
            self._closed = True
            for handle in self._hooks.values():
                handle.remove()
            self._hooks.clear()
            if self._live is not None:
                self._live.give_back()
                self._live = None
            self._persister.close(timeout_s=10.0)
            self._snapshotter.close(timeout=10.0)
            if self._stale_ranks_removal is not None:
                self._stale_ranks_removal.join(timeout=10.0)
            self._tier.close()
            if self._memory_fence is not None:
                self._memory_fence.close()
            self._comm.close()

    def _copy_live_into_slot(self) -> None:
        """close(): the last save may be held by the live slot alone, which the persist worker
        does not read and which the state changes under once the hook is gone (training may go
        on after close). Copy it into a slot, the snapshot of that step from now on."""
        snap = self._live
        if snap is None or not snap.check() or not snap.committed or snap.last is None:
            return
        step, sig, entries, objects, size = snap.last
        if self._memory_fence is not None:
            self._memory_fence.acquire()
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
                assert slot.base is not None and snap.slot.base is not None
                slot.base[:size].copy_(snap.slot.base[:size])
                self._commit(index, step, sig, entries, objects, size)
            except BaseException:
                with self._cond:
                    self._slots.copy_failed(index)
                raise
            with self._cond:
                self._slots.filled(index, step)
        finally:
            self._release_memory_fence()
        snap.retract()

    def _remove_stale_ranks(self) -> None:
        """Holding the tier's fence: set aside the rank directories of older generations, and
        delete them on a thread."""
        assert self._memory_fence is not None and self.config.memory_dir is not None
        self._stale_ranks_pending = False
        moved = stale_ranks.set_aside(
            self.config.memory_dir, self._memory_fence.mine, self._comm.world
        )
        self.stats.stale_ranks_removed += len(moved)
        self._stale_ranks_removal = stale_ranks.remove_later(moved)

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this checkpoint Manager is closed")

    def __enter__(self) -> Manager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(persist_last=exc[0] is None)


def _no_steps(name: str, limit: float) -> AbstractContextManager[None]:
    """A wait with no steps in it, declared to the agent (ftrun.section): the last persist at
    close() takes seconds, and with 0.3 s GPU steps the hang allowance after the last step is the
    2 s floor, so undeclared it read as a hang and the finished job was restarted. The section's
    allowance is the wait's own limit, plus time for the collective in persist_last."""
    return runtime.section(name, timeout_s=limit + SECTION_SLACK_S)
