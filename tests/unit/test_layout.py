"""Imports point one way (STYLE.md): the controller and agent never import torch, typer or rich;
only ftrun.cli imports typer and rich; `import ftrun` does no work."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["ftrun.controller.supervisor", "ftrun.agent.agent",
                                    "ftrun.agent.__main__", "ftrun.jobview", "ftrun"])
def test_core_modules_import_no_torch_or_ui(module):
    code = (f"import sys, {module}; bad = [m for m in ('torch', 'typer', 'rich') if m in sys.modules];"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
