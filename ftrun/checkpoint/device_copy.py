"""GPU tensors into a host slot: page-locked, on a side stream, ordered by CUDA events.

A plain `slot_view.copy_(gpu_tensor)` is the slow way twice over. Into pageable memory the
driver stages the copy through a bounce buffer and the calling thread waits for it; and on the
default stream it runs in line with the training kernels, so the GPU idles while PCIe works.
Instead:

- the slot's mapping is page-locked once (`cudaHostRegister`): the copy engine writes straight
  into the shared memory that the persist worker, the peer copy and a restart read, so there is
  no second host copy and no pinned pool beside the tier;
- the copies run on a side stream that first waits for an event the training thread recorded in
  `save()`, after the optimizer step's kernels: they overlap the next forward and backward on
  the copy engine;
- the next optimizer step waits for the copies' event on the GPU (`wait_event` on the training
  stream), not on the CPU: the training thread goes on queueing kernels. Only the snapshot
  thread blocks on the event, to know when the slot may be committed.

Where page-locking fails (an old driver, a locked-memory limit), the copy is still correct,
just staged and slower; the rank says so once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

import torch

Ready = dict[torch.device, "torch.cuda.Event"]
Done = list[tuple[torch.device, "torch.cuda.Event"]]

HOST_PORTABLE = 1  # cudaHostRegisterPortable

_side_streams: dict[torch.device, torch.cuda.Stream] = {}
_warned = False


def devices(tensors: Iterable[torch.Tensor]) -> list[torch.device]:
    """The CUDA devices among `tensors`, in first-seen order."""
    seen: dict[torch.device, None] = {}
    for t in tensors:
        if t.device.type == "cuda":
            seen.setdefault(t.device, None)
    return list(seen)


def mark_ready(devs: Sequence[torch.device]) -> Ready:
    """Training thread, in save(): an event on each device's current stream, after every kernel
    queued so far (the optimizer step, the small tensors' clones)."""
    ready: Ready = {}
    for dev in devs:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(dev))
        ready[dev] = event
    return ready


def enqueue(copies: Sequence[tuple[torch.Tensor, torch.Tensor]], ready: Ready) -> Done:
    """Snapshot thread: queue each (GPU source, host destination) copy on its device's side
    stream, behind that device's ready event; returns one event per device, after its copies."""
    done: Done = []
    for dev, event in ready.items():
        with torch.cuda.device(dev):
            stream = _side_streams.get(dev)
            if stream is None:
                stream = _side_streams[dev] = torch.cuda.Stream(dev)
            stream.wait_event(event)
            with torch.cuda.stream(stream):
                for src, dst in copies:
                    if src.device == dev:
                        dst.copy_(src, non_blocking=True)
            # blocking: the thread that waits for it sleeps instead of spinning on a core
            finished = torch.cuda.Event(blocking=True)
            finished.record(stream)
        done.append((dev, finished))
    return done


def wait_on_training_stream(done: Done) -> None:
    """Training thread, before the optimizer step: its stream waits for the copies (on the GPU)."""
    for dev, event in done:
        torch.cuda.current_stream(dev).wait_event(event)


def synchronize(done: Done) -> None:
    """Snapshot thread: block until the copies are in host memory."""
    for _, event in done:
        event.synchronize()


def pin(base: torch.Tensor, device: torch.device) -> bool:
    """Page-lock a slot's mapping for the copy engine; False (and one warning) if refused.

    Called on the snapshot thread, whose current device is cuda:0 unless set: registering there
    would make a context on another rank's GPU. Portable: every context sees it pinned."""
    global _warned
    with torch.cuda.device(device):
        err = torch.cuda.cudart().cudaHostRegister(base.data_ptr(), base.numel(), HOST_PORTABLE)
    if int(err) == 0:
        return True
    if not _warned:
        _warned = True
        print(
            f"ftrun.checkpoint: cannot page-lock the snapshot buffer ({err}); GPU snapshots are "
            "copied through pageable memory, correct but slower",
            file=sys.stderr,
            flush=True,
        )
    return False


def unpin(base: torch.Tensor) -> None:
    """Before the mapping goes: no copy into it is in flight by then (jobs run in order)."""
    torch.cuda.cudart().cudaHostUnregister(base.data_ptr())
