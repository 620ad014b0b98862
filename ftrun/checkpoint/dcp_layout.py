"""The storage tier's DCP side: plan who writes which tensor, and load with resharding.

Planning is torch.distributed.checkpoint's own (DefaultSavePlanner: fully-qualified names,
replicated tensors written once, load balanced across ranks). It runs once per state layout, not
per save: the plan and the `.metadata` it produces depend only on names, shapes and dtypes, so the
persist worker can write each save's bytes without any collective. Tensor bytes are stored raw
(no per-tensor torch.save envelope) at the offsets recorded in `.metadata`; RawReader reads them
back for `dcp.load`, whose planner does the resharding.

`.metadata` is DCP's Metadata pickled, as DCP writes it, but sealed with the checkpoint key
(auth.py): DCP's own FileSystemReader would `pickle.load` whatever file it finds there, so
RawReader reads it instead and unpickles it only once its HMAC is checked.
"""

from __future__ import annotations

import math
import mmap
import os
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, WriteItemType
from torch.futures import Future

from ftrun.checkpoint import auth, storage
from ftrun.checkpoint.comm import Comm
from ftrun.checkpoint.errors import CheckpointError, StateError

ALIGN = 4096  # O_DIRECT-friendly: the worker writes straight from the slot
DCP_VERSION = "1.0.0"


@dataclass(frozen=True)
class StoragePlan:
    """This rank's share of a persist: which tensors go where in its data file."""

    signature: str
    items: list[tuple[str, int, int]]  # (key, file offset, nbytes)
    metadata: bytes | None  # rank 0: the DCP Metadata for every rank's files, a sealed pickle


def plan_storage(
    tensors: dict[str, torch.Tensor], *, comm: Comm, signature: str, key: bytes
) -> StoragePlan:
    """Collective: every rank calls it with its flat tensors (same order of calls on all ranks)."""
    planner = DefaultSavePlanner(flatten_state_dict=False, flatten_sharded_tensors=False)
    planner.set_up_planner(tensors, storage_meta=None, is_coordinator=comm.rank == 0)
    local = planner.create_local_plan()
    plans = comm.all_gather(local)
    payload: tuple[list[list[tuple[str, int, int]]], bytes] | None = None
    if comm.rank == 0:
        global_plans, metadata = planner.create_global_plan(plans)
        per_rank, storage_data = [], {}
        for r, plan in enumerate(global_plans):
            offset, items = 0, []
            for item in plan.items:
                td = item.tensor_data
                if item.type == WriteItemType.BYTE_IO or td is None:
                    raise StateError(f"{item.index.fqn}: non-tensor item in a tensor plan")
                if any(td.chunk.offsets) or tuple(td.chunk.sizes) != tuple(td.size):
                    raise StateError(
                        f"{item.index.fqn} is sharded; only whole tensors are supported"
                    )
                nbytes = math.prod(td.size) * torch._utils._element_size(td.properties.dtype)
                offset = (offset + ALIGN - 1) // ALIGN * ALIGN
                storage_data[item.index] = _StorageInfo(storage.data_file_name(r), offset, nbytes)
                items.append((item.index.fqn, offset, nbytes))
                offset += nbytes
            per_rank.append(items)
        metadata.storage_data = storage_data
        metadata.version = DCP_VERSION
        metadata.storage_meta = StorageMeta()
        payload = (per_rank, auth.dumps(key, metadata))
    received = comm.broadcast(payload)
    assert received is not None  # rank 0 sent it
    per_rank, blob = received
    return StoragePlan(signature, per_rank[comm.rank], blob if comm.rank == 0 else None)


class RawReader(FileSystemReader):
    """FileSystemReader for raw tensor bytes (DCP's own writer wraps each tensor in torch.save)
    and a sealed `.metadata` (DCP's reader unpickles it unchecked)."""

    def __init__(self, path: str, *, key: bytes) -> None:
        super().__init__(path)
        self._key = key

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / storage.METADATA
        try:
            metadata = auth.loads(self._key, storage.read_regular(path))
        except (auth.NotAuthentic, storage.Invalid, OSError) as exc:
            # restore() verified it a moment ago: it changed since, under our feet
            raise CheckpointError(f"{path} cannot be loaded: {exc}") from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path} holds a {type(metadata).__name__}, not DCP Metadata")
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args, **kwargs
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._metadata = metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file = defaultdict(list)
        for req in plan.items:
            per_file[self.storage_data[req.storage_index].relative_path].append(req)
        for relative_path, reqs in per_file.items():
            fd = storage.open_regular(Path(self.path) / relative_path)  # no link, no FIFO
            with open(fd, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            try:
                base = torch.frombuffer(mm, dtype=torch.uint8)
                for req in reqs:
                    self._read_one(base, req, planner)
                del base
            finally:
                mm.close()
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read_one(self, base: torch.Tensor, req, planner: LoadPlanner) -> None:
        if req.type == LoadItemType.BYTE_IO:
            raise StateError(
                f"{req.storage_index.fqn}: unexpected byte item in an ftrun checkpoint"
            )
        info: _StorageInfo = self.storage_data[req.storage_index]
        md = self._metadata.state_dict_metadata[req.storage_index.fqn]
        assert isinstance(md, TensorStorageMetadata)
        chunk = next(c for c in md.chunks if tuple(c.offsets) == tuple(req.storage_index.offset))
        src = (
            base[info.offset : info.offset + info.length]
            .view(md.properties.dtype)
            .view(chunk.sizes)
        )
        src = narrow_tensor_by_index(src, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != src.size():
            raise StateError(
                f"{req.storage_index.fqn}: checkpoint has shape {tuple(src.size())}, "
                f"the model has {tuple(target.size())}"
            )
        target.copy_(src)
        planner.commit_tensor(req, target)


def load_storage(path: Path, tensors: dict[str, torch.Tensor], *, comm: Comm, key: bytes) -> None:
    """Load the named tensors in place from a committed checkpoint (reshards as needed)."""
    comm.settle()  # DCP's collectives run on our group too: after any in flight
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(
                tensors,
                storage_reader=RawReader(os.fspath(path), key=key),
                planner=DefaultLoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=False),
                process_group=comm.group,
                no_dist=not comm.distributed,
            )
    except dcp.api.CheckpointException as exc:
        raise StateError(
            f"cannot load {path}: {_first_failure(exc)}",
            hint="the model's parameter names or shapes differ from the checkpoint's",
        ) from None


def _first_failure(exc: BaseException) -> str:  # dcp's CheckpointException is a BaseException
    failures = getattr(exc, "failures", None) or {}
    for err in failures.values():
        inner = getattr(err, "exception", err)
        return f"{type(inner).__name__}: {str(inner)[:300]}"
    return str(exc)[:300]
