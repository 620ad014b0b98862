"""Manager: the object a training script holds. Snapshot, persist, restore.

This module is the public API and the order of things in one rank. The rules live elsewhere:
which slot a save writes into, which one the worker reads and when a persist may start are the
pure `slot_table.SlotTable`; a save copied into a slot in the background is the copy path
(`copy_path.py`), one the live snapshot holds with next to nothing copied the live path
(`live_path.py`); the worker and its messages are `persist_client.py`; which saves are
persisted, agreed by all ranks, is `persister.py`; the tier choice is `restore.py`; the claim on
the directories, `generation_claim.py`. Per rank: a snapshot thread (copies tensors into a slot
while the next forward/backward runs), a persist worker process (writes a slot to storage at idle
priority) and its reply-reader thread; they meet in the slot table, under `_cond`.

    save(step)  ── references + small copies ──▶ snapshot thread ── memcpy ──▶ slot (memory tier)
                                                                   └─ persist? ─▶ worker ─▶ storage
    next optimizer.step() ─ pre-step hook ─▶ wait_snapshot() (blocks only if the copy is not done;
                                             GPU tensors: the training stream waits, not the thread)

Every save reaches the memory tier; at most one persist is in flight, at no more than
`persist_bandwidth` MB/s (on the reference VM, unthrottled writes at 1-2 GB/s slow training by
10-100%, 300 MB/s by a few %). All ranks agree whether a save is persisted (one all-reduce).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch

from ftrun import runtime
from ftrun.checkpoint import capacity, device_copy, storage
from ftrun.checkpoint import restore as restore_mod
from ftrun.checkpoint.agent_notices import Preemption, StallReport, no_steps
from ftrun.checkpoint.comm import Comm
from ftrun.checkpoint.config import CheckpointConfig, resolve_config
from ftrun.checkpoint.copy_path import CopyPath
from ftrun.checkpoint.errors import CheckpointError
from ftrun.checkpoint.fence import Superseded
from ftrun.checkpoint.generation_claim import GenerationClaim
from ftrun.checkpoint.guard import Guard
from ftrun.checkpoint.live_path import LivePath
from ftrun.checkpoint.persist_client import PersistClient
from ftrun.checkpoint.persister import Persister, worker_died
from ftrun.checkpoint.restore import warn
from ftrun.checkpoint.slot_layout import LayoutCache
from ftrun.checkpoint.slot_table import SlotTable
from ftrun.checkpoint.snapshot_meta import SnapshotMeta
from ftrun.checkpoint.state import apply, flatten, keyed_tensors, pickle_objects
from ftrun.checkpoint.stats import Stats


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
        # Both directories are claimed for this generation before either is read (fence.py).
        try:
            self._tier, self._claim = GenerationClaim.open(self.config, rank=rank, world=world)
        except BaseException:
            self._comm.close()
            raise
        self._tier.run = nonce  # the host's record of this rank's progress (host_progress.py)
        self._cond = threading.Condition()
        self._slots = SlotTable(self.config.memory_slots)  # guarded by _cond
        self._capacity = capacity.Capacity(
            self._tier,
            root=self.config.memory_root,
            copies=self.config.memory_slots,
            live=self.config.live_snapshot,
            on_leave=self._leave_level,
            on_retire=lambda index: self._copies.retire(index),
        )
        self._last_saved: int | None = None
        self._hooks: dict[int, Any] = {}
        self._layout_of = LayoutCache(world)
        self._guard = Guard(rank=rank)  # a change outside the fence seen: copy in save()
        self.restored: restore_mod.Restored | None = None
        self.stats = Stats()
        self._report_stall = StallReport(self.stats)  # rank 0 (agent_notices.py)
        self._preemption = Preemption(self.config.preempt_file, rank=rank)
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
            self._tier.close()
            self._claim.release()
            self._claim.close(timeout=10.0)
            self._comm.close()
            raise
        # Both paths commit through self._commit, looked up at each call (a test replaces it).
        self._live = LivePath(
            self.config,
            tier=self._tier,
            capacity=self._capacity,
            claim=self._claim,
            guard=self._guard,
            persister=self._persister,
            commit=lambda index, meta: self._commit(index, meta),
        )
        self._copies = CopyPath(
            self.config,
            tier=self._tier,
            table=self._slots,
            cond=self._cond,
            persister=self._persister,
            capacity=self._capacity,
            guard=self._guard,
            claim=self._claim,
            stats=self.stats,
            commit=lambda index, meta: self._commit(index, meta),
            on_full_copy=self._live.full_copy_took,
        )
        self._closed = False

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
        self._copies.wait_done()
        self._live.let_go(check=False)  # loading into the adopted tensors changes them
        t0 = time.perf_counter()
        flat = flatten(state)
        self.attach(*flat.optimizers())
        restored, objects, slot_index = restore_mod.restore(
            flat, comm=self._comm, tier=self._tier, config=self.config
        )
        apply(flat, objects)
        if slot_index == self._tier.live_index:  # not one of the slot table's
            slot_index = None
        self._copies.restored(restored.step, slot_index, keyed_tensors(flat, self.rank))
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
        self._live.time_save(t0)
        self._copies.wait_done()
        self._live.let_go()  # this save writes into the live slot, or leaves it behind
        if self._slots.worker_gone:
            raise worker_died()
        if self._persister.superseded:  # the worker's commit was refused: we are a zombie
            raise Superseded(self._persister.superseded)
        self._capacity.check()  # a write into the tier found no room: one level down
        flat = flatten(state, saving=True)
        self.attach(*flat.optimizers())
        keyed = keyed_tensors(flat, self.rank)
        layout = self._layout_of(keyed)
        meta = SnapshotMeta(step, layout, pickle_objects(flat, key=self.config.hmac_key))
        noticed = self._preemption.noticed()  # a preemption notice: persist this one
        persist, urgent = self._persister.wanted(step, keyed, layout.sig, preempted=noticed)
        gpus = device_copy.devices(t for _, t in keyed)
        # Every slot reserved before the state is adopted or copied, or the tier steps down.
        self._capacity.reserve(layout.size, wait_idle=partial(self.wait_ready, None))
        adopted = not gpus and self._live.adopt(flat, keyed, layout)
        copy_all = (
            persist
            or adopted  # the first full copy: the restore's fallback from then on
            or not self._live.active
            or self.stats.saves % self._persister.full_copy_every == 0
        )
        self._copies.make_room(copy=copy_all)  # not over a step the host's ranks still need
        # Held until the slot's manifest is written (copy_path.py, live_path.py) or the copy
        # failed: a newer generation cannot claim the tier while this rank writes into it.
        self._claim.acquire()
        try:
            if self.stats.persisted:  # after this rank's first persist (generation_claim.py)
                self.stats.stale_ranks_removed += self._claim.remove_stale_ranks(self.world_size)
            index, persist = self._copies.take_slot(step, persist=persist, copy=copy_all)
        except BaseException:
            self._claim.release()
            raise
        if not copy_all:
            self._live.save(meta, keyed)
            self.stats.live_saves += 1
            self._saved(step, t0)
            return
        self._copies.start(meta, keyed, index, gpus=gpus, persist=persist)
        if self._guard.tripped:  # copied (the training thread helps) and committed on return
            self._copies.wait_done()
        self._saved(step, t0)
        if urgent:  # the save a preemption notice asked for: committed, then the agent told
            self._preemption.answer(
                step, persisted=persist, wait_persist=self.wait_persist, stats=self.stats
            )

    def _saved(self, step: int, t0: float) -> None:
        """save()'s bookkeeping, once the snapshot of `step` is committed or queued."""
        self._last_saved = step
        self.stats.saves += 1
        self.stats.save_s += time.perf_counter() - t0
        if self.rank == 0:
            self._report_stall()

    def _commit(self, index: int, meta: SnapshotMeta) -> None:
        """Write the manifest of the snapshot `meta` in slot `index` (the live one too)."""
        self._tier.commit(
            index,
            step=meta.step,
            generation=self.config.generation,
            sig=meta.layout.sig,
            entries=meta.layout.entries,
            objects=meta.objects,
            data_size=meta.layout.size,
        )

    def _leave_level(self, level: capacity.Level, drop_slots: bool) -> None:
        """The tier steps down (capacity.py): below LIVE the tensors go back to the heap; slots
        that leave the tier root are forgotten, once the worker has let go of them."""
        if level < capacity.Level.LIVE:
            self._live.leave()
        if drop_slots:
            self._copies.forget_slots()

    # -- waiting -------------------------------------------------------------------------------

    def wait_snapshot(self, timeout: float | None = None) -> None:
        """Block until the last save's copy is complete (the optimizer pre-step hook calls this):
        from then on the state may change."""
        self._copies.wait_copied(timeout)
        self._live.let_go()  # the state may change from here: not a snapshot any more

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the snapshot buffers are allocated and faulted in (done in the background
        after restore() and the first save(); a benchmark calls this to leave warm-up out)."""
        return self._copies.wait_ready(timeout)

    def wait_persist(self, timeout: float | None = None) -> bool:
        """Wait until no persist is in flight on this rank; False on timeout."""
        limit = self.config.persist_timeout if timeout is None else timeout
        with no_steps("checkpoint persist", limit):
            return self._wait_persist(limit)

    def _wait_persist(self, limit: float) -> bool:
        self._copies.wait_done()
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
            with no_steps("checkpoint close", limit):
                self._copies.wait_done()
                self._live.copy_out(self._copies.copy_now)  # the worker reads slots only
                if self.rank == 0 and self.stats.saves:
                    self._report_stall(final=True)
                if persist_last:
                    self._persister.persist_last(self._last_saved, limit)  # collective
                if not self._wait_persist(limit):
                    warn(f"the last persist did not finish within {limit} s")
        finally:
            self._closed = True
            for handle in self._hooks.values():
                handle.remove()
            self._hooks.clear()
            self._live.close()
            self._persister.close(timeout_s=10.0)
            self._copies.snapshotter.close(timeout=10.0)
            self._tier.close()
            self._claim.close(timeout=10.0)
            self._comm.close()

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this checkpoint Manager is closed")

    def __enter__(self) -> Manager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(persist_last=exc[0] is None)
