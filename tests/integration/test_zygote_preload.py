"""What the warm interpreter preloads (ftrun/agent/zygote.py), in fresh interpreters: the
default leaves torch._dynamo to the script, and a list that pulls it in stops there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ftrun.agent.zygote import DEFAULT_PRELOAD


def _preload_in_a_fresh_interpreter(modules: str, where: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        "from ftrun.agent.zygote import Zygote\n"
        "z = Zygote(sys.argv[1])\n"
        "z.preload(sys.argv[2])\n"
        "print('torch._dynamo' in sys.modules, 'torch.distributed' in sys.modules)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(where / "z.sock"), modules],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_default_preload_leaves_torch_dynamo_to_the_script(tmp_path):
    """torch._dynamo imported before the script's init_process_group() makes torch's gloo exit
    deadlock likely (5 of 10 warm ddp_destroy runs; docs/architecture.md): the default preload
    must bring in what DDP needs except it."""
    done = _preload_in_a_fresh_interpreter(DEFAULT_PRELOAD, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
    assert "ftrun:" not in done.stderr


def test_a_preload_that_pulls_in_torch_dynamo_stops_there_with_one_line(tmp_path):
    # torch._functorch.aot_autograd imports torch._dynamo; preloading ends before no_such_mod
    done = _preload_in_a_fresh_interpreter(
        "torch,torch._functorch.aot_autograd,no_such_mod", tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "True"
    lines = [line for line in done.stderr.splitlines() if line.startswith("ftrun:")]
    assert len(lines) == 1 and "torch._functorch.aot_autograd imported torch._dynamo" in lines[0]


def test_a_module_of_the_users_list_that_cannot_be_imported_is_named(tmp_path):
    done = _preload_in_a_fresh_interpreter("torch,no_such_module_here", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "cannot preload no_such_module_here" in done.stderr
