"""Shared helpers for the ftrun.checkpoint tests: a tiny training setup and a Manager factory
that cleans up after itself (closes managers, proves their persist workers exited, deletes the
memory tier)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

import ftrun.checkpoint as ckpt


class Loader:
    """A data source whose position and generator are checkpoint state."""

    def __init__(self, seed: int = 7, width: int = 8) -> None:
        self.width = width
        self.generator = torch.Generator().manual_seed(seed)
        self.position = 0

    def next(self) -> torch.Tensor:
        self.position += 1
        return torch.randn(4, self.width, generator=self.generator)

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "generator": self.generator.get_state()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.position = sd["position"]
        self.generator.set_state(sd["generator"])


class Toy:
    """Model + AdamW + loader; dropout draws from torch's global RNG."""

    def __init__(self, seed: int = 0, width: int = 8) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.Dropout(0.25), torch.nn.Linear(width, 1)
        )
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.05)
        self.loader = Loader(width=width)
        self.extra = {"epoch": 0, "note": "n"}
        self.state = {
            "train": ckpt.TrainState(self.model, self.opt),
            "data": ckpt.PerRank(self.loader),
            "extra": self.extra,
        }

    def step(self) -> float:
        x = self.loader.next()
        loss = (self.model(x) - x.sum(1, keepdim=True).sin()).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.extra["epoch"] += 1
        return loss.item()

    def tensors(self) -> dict[str, torch.Tensor]:
        sd = self.state["train"].state_dict()
        flat = {f"model.{k}": v.clone() for k, v in sd["model"].items()}
        flat.update(
            {f"optim.{k}": v.clone() for k, v in sd["optim"].items() if isinstance(v, torch.Tensor)}
        )
        return flat


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


class Managers:
    """Builds Managers for one test: per-test job id (memory tier) and checkpoint directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.directory = tmp_path / "ckpt"
        self.job = f"test-{uuid.uuid4().hex[:10]}"
        self.made: list[ckpt.Manager] = []

    def __call__(self, directory: Path | None = None, **options: Any) -> ckpt.Manager:
        if options.get("memory") is not False:
            options.setdefault("job_id", self.job)
        options.setdefault("persist_bandwidth", 0)
        options.setdefault("persist_interval", 0)  # these tests want the storage tier current
        mgr = ckpt.Manager(directory or self.directory, **options)
        self.made.append(mgr)
        return mgr

    def cleanup(self) -> None:
        try:
            for mgr in self.made:
                mgr.close(persist_last=False, timeout=30)
                assert mgr._client.proc.poll() is not None, "a persist worker outlived close()"
        finally:
            shutil.rmtree(ckpt.memory_tier_dir(self.job), ignore_errors=True)


def recorded_steps(record: Path, rank: int, gen: int = 1) -> list[tuple[int, float]]:
    """(step, wall time) of each step a rank of tests/bin/ckpt_train.py ran with --record."""
    path = record / f"g{gen}-r{rank}.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(w[1]), float(w[2])) for w in (line.split() for line in lines) if w[0] == "STEP"]


def kill_and_adopt(ftrun: Any, proc: Any, job: str, record: Path, *, hosts: str, steps: int) -> Any:
    """SIGKILL a running job's controller, see its ranks train on without it, `ftrun resume`
    it and check the resumed controller adopted generation 1: the same rank processes, every
    recorded step once. Returns the resume's CompletedProcess."""
    import time

    from tests.conftest import wait_for

    ranks = {e["rank"]: e["pid"] for e in ftrun.events(job) if e["kind"] == "rank_started"}
    proc.kill()
    proc.wait(timeout=10)
    killed_t = time.time()
    wait_for(
        lambda: sum(t > killed_t + 0.5 for _, t in recorded_steps(record, 1)) >= 3,
        30,
        "steps without a controller",
    )
    resumed = ftrun.run("resume", job, timeout=120)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"adopted generation 1 on {hosts}" in resumed.stderr, resumed.stderr[-3000:]
    events = ftrun.events(job)
    assert [e["gen"] for e in events if e["kind"] == "generation_launched"] == [1]
    assert {e["rank"]: e["pid"] for e in events if e["kind"] == "rank_started"} == ranks
    for rank in (0, 1):  # every step once, none lost, none done twice
        done = [s for s, _ in recorded_steps(record, rank)]
        assert done == list(range(1, steps + 1)), done[-5:]
    return resumed
