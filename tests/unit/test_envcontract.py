"""The environment contract has one table (ftrun/envcontract.py): no other module spells an
FTRUN_* name, and the rank shim's own copy (it imports nothing of ftrun) matches the table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ftrun import envcontract
from ftrun.agent import rank_shim

PACKAGE = Path(envcontract.__file__).resolve().parent
NAME = re.compile(r"^FTRUN_[A-Z0-9_]+$")


def name_literals(path: Path) -> set[str]:
    """String constants that are exactly an FTRUN_* name (docstrings and prose are not)."""
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value)
    }


def test_every_name_is_in_the_table_once() -> None:
    names = [var.name for var in envcontract.CONTRACT]
    assert len(names) == len(set(names))
    constants = {
        value
        for key, value in vars(envcontract).items()
        if key.isupper() and isinstance(value, str) and NAME.match(value)
    }
    assert constants == set(names)


def test_no_module_but_the_table_and_the_shim_spells_a_name() -> None:
    spelled = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("envcontract.py", "rank_shim.py") or "__pycache__" in path.parts:
            continue
        if found := name_literals(path):
            spelled[str(path.relative_to(PACKAGE))] = sorted(found)
    assert spelled == {}


def test_the_rank_shims_copy_matches_the_table() -> None:
    shim = Path(rank_shim.__file__)
    table = {var.name for var in envcontract.CONTRACT}
    literals = name_literals(shim)
    assert literals <= table, literals - table
    assert set(envcontract.RANK_SHIM_NAMES) <= literals
    # The restart variables are spelled as a prefix + torchrun's name in the shim.
    for contract_name in (envcontract.RESTART_COUNT, envcontract.MAX_RESTARTS):
        assert contract_name.removeprefix("FTRUN_") in shim.read_text()
        assert contract_name.startswith("FTRUN_TORCHELASTIC_")


def test_forwarded_takes_the_prefixes_and_names_and_nothing_else() -> None:
    environ = {
        "NCCL_DEBUG": "INFO",
        "PYTHONPATH": "/x",
        "CUDA_VISIBLE_DEVICES": "0",
        "HOME": "/root",
        "FTRUN_RUN_DIR": "/runs",
        "PYTHONHOME": "/usr",
    }
    assert envcontract.forwarded(environ) == {
        "NCCL_DEBUG": "INFO",
        "PYTHONPATH": "/x",
        "FTRUN_RUN_DIR": "/runs",
    }
