"""The warm interpreter's preload (ftrun/agent/zygote.py), in a fresh interpreter: a module that
cannot be imported is named and skipped, and the rest of the list is preloaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _preload_in_a_fresh_interpreter(modules: str, where: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        "from ftrun.agent.zygote import Zygote\n"
        "z = Zygote(sys.argv[1])\n"
        "z.preload(sys.argv[2])\n"
        "print('torch' in sys.modules)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(where / "z.sock"), modules],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_module_of_the_users_list_that_cannot_be_imported_is_named(tmp_path):
    done = _preload_in_a_fresh_interpreter("torch,no_such_module_here", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "cannot preload no_such_module_here" in done.stderr
    assert done.stdout.split() == ["True"]  # and the rest of the list was preloaded
