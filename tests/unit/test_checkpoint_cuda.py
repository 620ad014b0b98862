"""The GPU path of ftrun.checkpoint (device_copy.py): snapshots of CUDA tensors through
page-locked slots on a side stream. Runs where torch sees a GPU (scripts/gpu_check.sh on a lent
machine); skipped elsewhere, since nothing else exercises this path."""

from __future__ import annotations

import pytest
import torch

import ftrun.checkpoint as ckpt
from tests.integration.ckpt_helpers import Managers, assert_same

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

WIDTH = 2048  # 4 layers of 16 MiB weights: each copy takes long enough to race the next step


class GpuToy:
    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.device = torch.device("cuda", torch.cuda.current_device())
        layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)]
        self.model = torch.nn.Sequential(*layers).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.position = {"step": 0}
        self.state = {"train": ckpt.TrainState(self.model, self.opt), "data": self.position}

    def step(self) -> float:
        self.position["step"] += 1
        x = torch.randn(512, WIDTH, device=self.device)
        loss = self.model(x).square().mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()  # changes every parameter and both moments
        return float(loss)

    def tensors(self) -> dict[str, torch.Tensor]:
        sd = self.state["train"].state_dict()
        flat = {f"model.{k}": v.detach().cpu().clone() for k, v in sd["model"].items()}
        flat.update(
            {
                f"optim.{k}": v.detach().cpu().clone()
                for k, v in sd["optim"].items()
                if isinstance(v, torch.Tensor)
            }
        )
        return flat


@pytest.fixture
def managers(tmp_path):
    made = Managers(tmp_path)
    yield made
    made.cleanup()


@pytest.mark.parametrize("memory", [False, True], ids=["storage", "memory"])
def test_each_snapshot_holds_its_steps_values_while_the_gpu_runs_on(managers, memory):
    """Save every step and step again at once: the optimizer kernels are queued right behind the
    snapshot's copies, and must wait for them on the GPU. The restored state is the last save's,
    bit for bit, from either tier, into a model on the GPU."""
    toy = GpuToy()
    mgr = managers(memory=memory)
    assert mgr.restore(toy.state) == 0
    at_save = {}
    for step in range(1, 9):
        toy.step()
        mgr.save(step, toy.state)
        at_save[step] = toy.tensors()  # a device sync: reads what save() captured
        toy.step()  # not saved: its writes must not reach the snapshot of `step`
    last = max(at_save)
    mgr.close()  # persists the last snapshot
    fresh = GpuToy(seed=9)
    mgr2 = managers(memory=memory)
    assert mgr2.restore(fresh.state) == last
    assert mgr2.restored.tier == ("memory" if memory else "storage")
    assert fresh.model[0].weight.device.type == "cuda"
    assert_same(fresh.tensors(), at_save[last])
    assert fresh.position == {"step": 2 * last - 1}


def test_the_slots_are_page_locked_for_the_copy_engine(managers):
    """Registered (not copied into a pinned pool): the persist worker and a restart read the
    very pages the GPU wrote."""
    toy = GpuToy()
    mgr = managers()
    mgr.restore(toy.state)
    toy.step()
    mgr.save(1, toy.state)
    assert mgr.wait_ready(60)
    slots = mgr._tier.slots
    assert slots and all(s.pinned for s in slots)
    assert all(s.base is not None and s.base.is_pinned() for s in slots)
    mgr.close(persist_last=False)
    assert all(s.base is None for s in slots)  # unregistered, then unmapped
