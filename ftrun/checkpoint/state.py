"""What a checkpoint holds: the user's state, flattened to fully-qualified names.

`state` is a dict whose values are Stateful objects (`state_dict()`/`load_state_dict()`), nested
dicts, tensors or plain Python values. Flattening joins the keys with "." ("train.model.layers.0
.weight"), the way torch.distributed.checkpoint (DCP) names things, so a tensor has the same name
whatever the DP x PP layout that holds it.

- Tensors go through DCP: a checkpoint written under one layout loads under another.
- Other values (hyper-parameters, counters) are pickled, sealed with the checkpoint key
  (auth.py: what does not verify is never unpickled); a value held by several ranks is taken
  from the lowest rank that saved it, as DCP does.
- `PerRank(x)` marks state that differs per rank (a data iterator's position); it comes back to
  the same rank, and only when the world size is unchanged. The RNG states (Python, NumPy, torch
  CPU and CUDA) are always saved per rank, so a resumed run draws the same numbers.

`TrainState(model, optimizer)` uses DCP's get/set_state_dict with flattened optimizer state, so
optimizer state is keyed by parameter name too (and survives resharding).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from ftrun.checkpoint import auth, state_cache
from ftrun.checkpoint.errors import StateError

RNG_KEY = "__rng__"


class TrainState:
    """A model and its optimizer(s), saved by parameter name (reshardable)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    ) -> None:
        self.model = model
        self.optimizers = (
            [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
        )
        self._options = StateDictOptions(flatten_optimizer_state_dict=True)
        self._cached: state_cache.CachedStateDict | None = None
        self._uncacheable: Hashable | None = None  # the fingerprint that could not be cached
        # save_leaves()'s answer, for (the cached state dict, key, local) it was made from
        self._leaves: (
            tuple[tuple[Any, str, bool], tuple[list[TensorLeaf], list[Leaf]] | None] | None
        ) = None

    def state_dict(self) -> dict[str, Any]:
        """DCP's state dict, made by torch when the model or optimizer changed since the last
        call, else from the cache of the last one (state_cache.py: 6.9 -> 0.85 ms here)."""
        cached, made = self._refreshed()
        if made is not None:
            return made
        assert cached is not None
        return cached.current()

    def save_leaves(self, key: str, local: bool) -> tuple[list[TensorLeaf], list[Leaf]] | None:
        """save()'s flattening of this state, made once per cached state dict: the same leaves
        flatten() would make of state_dict(), the plain values read live from the optimizer's
        dicts. None when the state dict is not cached (flatten() walks it as any other)."""
        cached, _ = self._refreshed()
        if cached is None:
            return None
        if self._leaves is None or self._leaves[0] != (cached, key, local):
            self._leaves = ((cached, key, local), _cached_leaves(cached, key, local))
        return self._leaves[1]

    def _refreshed(self) -> tuple[state_cache.CachedStateDict | None, dict[str, Any] | None]:
        """(the cache, right for the model and optimizers as they are now, or None when they
        cannot be cached; the state dict torch made, when it had to)."""
        key = state_cache.fingerprint(self.model, self.optimizers)
        if self._cached is not None and self._cached.key == key:
            return self._cached, None
        model_sd, optim_sd = get_state_dict(self.model, self.optimizers, options=self._options)
        sd = {"model": model_sd, "optim": optim_sd}
        # get_state_dict may create the optimizer's state (its first call, before any step).
        key = state_cache.fingerprint(self.model, self.optimizers)
        self._cached = (
            None
            if key == self._uncacheable
            else state_cache.build(self.model, self.optimizers, sd, key)
        )
        if self._cached is None:
            self._uncacheable = key
        return self._cached, sd

    def forget_cache(self) -> None:
        """Drop the cached state dict (it holds aliases of the tensors it was made of)."""
        self._cached = None
        self._leaves = None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._cached = None
        set_state_dict(
            self.model,
            self.optimizers,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
            options=self._options,
        )


@dataclass(frozen=True)
class PerRank:
    """Marks state that is different on every rank (e.g. a data loader's position)."""

    value: Any


def _is_stateful(value: Any) -> bool:
    return (
        not isinstance(value, (torch.Tensor, Mapping))
        and callable(getattr(value, "state_dict", None))
        and callable(getattr(value, "load_state_dict", None))
    )


@dataclass
class Leaf:
    key: str
    container: dict[str, Any]
    name: str
    local: bool
    tensor: torch.Tensor | None = None  # detached alias of a tensor leaf (shares its storage)

    @property
    def value(self) -> Any:
        return self.tensor if self.tensor is not None else self.container[self.name]


@dataclass
class TensorLeaf(Leaf):
    """A tensor leaf: `tensor` is always set."""

    tensor: torch.Tensor


@dataclass
class Flat:
    """The flattened state: leaves that point back into the dicts they came from."""

    tensors: list[TensorLeaf] = field(default_factory=list)
    objects: list[Leaf] = field(default_factory=list)
    roots: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)  # (Stateful, its dict)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            opt for obj, _ in self.roots if isinstance(obj, TrainState) for opt in obj.optimizers
        ]


def flatten(state: Mapping[str, Any], *, rng: bool = True, saving: bool = False) -> Flat:
    """`saving`: for save(), which reads the leaves and puts nothing back: a TrainState's come
    from its cache (TrainState.save_leaves), and its root has no state dict to load."""
    if not isinstance(state, Mapping):
        raise StateError(
            f"state must be a dict of name -> object, not {type(state).__name__}",
            hint="e.g. {'train': ftrun.checkpoint.TrainState(model, optimizer)}",
        )
    flat = Flat()
    top: dict[str, Any] = {}
    for name, value in state.items():
        local = isinstance(value, PerRank)
        inner = value.value if local else value
        # restore() puts values back into the containers they came from; a bare top-level value
        # has none the caller can see, so it would silently not be restored.
        if not (_is_stateful(inner) or isinstance(inner, (dict, torch.Tensor))):
            raise StateError(
                f"state[{name!r}] is a {type(inner).__name__}; top-level values must "
                "be dicts, tensors or objects with state_dict()/load_state_dict()",
                hint=f"wrap it in a dict, e.g. {{{name!r}: {{'value': ...}}}}",
            )
        top[str(name)] = inner
        _walk(flat, top, str(name), str(name), local, saving)
    if rng:
        holder = {RNG_KEY: capture_rng()}
        flat.objects.append(Leaf(RNG_KEY, holder, RNG_KEY, True))
    return flat


# Values that are leaves whatever they hold: most of a flattened optimizer state dict (each param
# group's hyper-parameters, repeated for every parameter), checked first because save() walks
# thousands of them on the training thread.
_PLAIN = frozenset({int, float, bool, str, tuple, type(None)})


def _walk(
    flat: Flat, container: dict[str, Any], name: str, key: str, local: bool, saving: bool
) -> None:
    value = container[name]
    kind = type(value)
    if kind in _PLAIN:
        flat.objects.append(Leaf(key, container, name, local))
    elif kind is torch.Tensor or kind is torch.nn.Parameter:
        flat.tensors.append(TensorLeaf(key, container, name, local, value.detach()))
    elif saving and kind is TrainState and (leaves := value.save_leaves(key, local)) is not None:
        flat.roots.append((value, {}))
        flat.tensors += leaves[0]
        flat.objects += leaves[1]
    elif _is_stateful(value):
        sd = value.state_dict()
        if not isinstance(sd, dict):
            raise StateError(f"{key}.state_dict() returned {type(sd).__name__}, not a dict")
        flat.roots.append((value, sd))
        for sub in list(sd):
            _walk(flat, sd, sub, f"{key}.{sub}", local, saving)
    elif isinstance(value, dict):
        for sub in list(value):
            _walk(flat, value, sub, f"{key}.{sub}", local, saving)
    elif isinstance(value, torch.Tensor):  # a subclass: DTensor, FSDP's flat parameters
        raise StateError(
            f"{key} is a {type(value).__name__}; only plain tensors are supported",
            hint="DTensor/FSDP state is not supported by ftrun.checkpoint yet",
        )
    else:
        flat.objects.append(Leaf(key, container, name, local))


def _cached_leaves(
    cached: state_cache.CachedStateDict, key: str, local: bool
) -> tuple[list[TensorLeaf], list[Leaf]] | None:
    """The leaves _walk makes of `cached.current()` under `key`, in its order, each pointing at
    where its value lives: the tensors (the fingerprint guards them) and the optimizer's own
    dicts for plain values, so a later save reads them as they are then. None when an entry is
    one _walk would go into (a dict, a Stateful) or refuse."""
    tensors = [
        TensorLeaf(f"{key}.model.{name}", cached.model_entries, name, local, t.detach())
        for name, t in cached.model_entries.items()
    ]
    objects: list[Leaf] = []
    for name, (box, entry) in cached.optim_sources.items():
        value, fqn = box[entry], f"{key}.optim.{name}"
        if type(value) is torch.Tensor or type(value) is torch.nn.Parameter:
            tensors.append(TensorLeaf(fqn, box, entry, local, value.detach()))
        elif isinstance(value, (dict, torch.Tensor)) or _is_stateful(value):
            return None
        else:
            objects.append(Leaf(fqn, box, entry, local))
    return tensors, objects


def storage_key(leaf: Leaf, rank: int) -> str:
    """The DCP name of a tensor: its FQN, or a rank-qualified one for PerRank state."""
    return f"__rank{rank}__.{leaf.key}" if leaf.local else leaf.key


def keyed_tensors(flat: Flat, rank: int) -> list[tuple[str, torch.Tensor]]:
    """(storage key, tensor) for every tensor leaf, in flattening order."""
    return [(storage_key(leaf, rank), leaf.tensor) for leaf in flat.tensors]


def pickle_objects(flat: Flat, *, key: bytes) -> bytes:
    """The non-tensor values of a save, shared and per rank apart, as a pickle sealed with the
    checkpoint key (auth.py; restore.py reads them back with auth.loads)."""
    shared = {leaf.key: leaf.value for leaf in flat.objects if not leaf.local}
    local = {leaf.key: leaf.value for leaf in flat.objects if leaf.local}
    return auth.dumps(key, {"global": shared, "local": local})


def apply(flat: Flat, objects: Mapping[str, Any]) -> None:
    """After tensors were loaded in place: put back loaded objects, then call load_state_dict."""
    for leaf in flat.objects:
        if leaf.key in objects:
            leaf.container[leaf.name] = objects[leaf.key]
    rng_state = objects.get(RNG_KEY)
    for obj, sd in reversed(flat.roots):  # innermost first
        obj.load_state_dict(sd)
    if rng_state is not None:
        restore_rng(rng_state)


def capture_rng() -> dict[str, Any]:
    """The RNG states of this process. torch's as bytes: a tensor pickles through torch.save,
    ~50 us of every save() (older checkpoints hold tensors; restore_rng takes both)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": _bytes(torch.get_rng_state())}
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(_tensor(state["torch"]))
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_tensor(s) for s in state["cuda"]])


def _bytes(rng_state: torch.Tensor) -> bytes:
    return rng_state.numpy().tobytes()


def _tensor(rng_state: bytes | torch.Tensor) -> torch.Tensor:
    if isinstance(rng_state, torch.Tensor):
        return rng_state
    return torch.frombuffer(bytearray(rng_state), dtype=torch.uint8)
