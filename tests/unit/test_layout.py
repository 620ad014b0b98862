"""Imports point one way (STYLE.md), checked from the source of every module in ftrun/:

    cli ─▶ controller ─▶ transport ─▶ agent ─▶ ground floor (ftrun/*.py: config, errors…, and
    the small packages journal/ and wire/)
    checkpoint, parallel, planner stand alone: they run inside ranks or stay pure (the
    controller may import the planner: it plans with it)
    jobview stands alone too: the journal read back for status/inspect, imported by cli only

No module-level import loop anywhere; the controller and agent never import torch, typer or
rich; only ftrun.cli imports typer and rich; `import ftrun` does no work; no module is over
350 lines.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ftrun"

# Where each part of the tree may not reach. A module's part is its subpackage under ftrun/,
# or "ground" for the modules directly in ftrun/ (ftrun/__main__.py is the entry point: exempt).
LAYERS = ["cli", "controller", "transport", "agent", "ground"]  # each imports only rightwards
STANDALONE = {"checkpoint", "parallel", "planner", "jobview"}  # import only the ground floor
FORBIDDEN: dict[str, set[str]] = {
    part: set(LAYERS[: LAYERS.index(part)]) | STANDALONE for part in LAYERS
}
FORBIDDEN["cli"] = set()
# The controller plans with the planner (STYLE.md: cli → controller → transport/planner/...).
FORBIDDEN["controller"].discard("planner")
FORBIDDEN.update({part: set(LAYERS) - {"ground"} for part in STANDALONE})
# The peer tier runs in the agent (which imports it) and moves ftrun.checkpoint's memory-tier
# files, so it reads their format from checkpoint (no torch); nothing below the agent imports it.
FORBIDDEN["peercopy"] = (set(LAYERS) - {"ground"}) | (STANDALONE - {"checkpoint"})
for part in ("controller", "transport", "ground", *STANDALONE):
    FORBIDDEN[part].add("peercopy")
# The journal and the wire are small packages of the ground floor (issue 35): what the ground
# floor may not reach, they may not either; whatever may import the ground floor imports them.
for part in ("journal", "wire"):
    FORBIDDEN[part] = set(FORBIDDEN["ground"]) | {"sim"}
# The simulator drives the controller's own decisions on a simulated clock: no hosts, no ranks.
FORBIDDEN["sim"] = {"cli", "transport", "agent", "peercopy", "checkpoint"}
for part in LAYERS[1:] + sorted(STANDALONE):
    FORBIDDEN[part].add("sim")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str:
    pieces = module.split(".")
    if len(pieces) == 1 or (len(pieces) == 2 and not (PACKAGE / pieces[1]).is_dir()):
        return "ground"
    return pieces[1]


@functools.cache
def modules() -> dict[str, Path]:
    return {
        module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts
    }


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Every ftrun module this one imports, at any depth of its code (a lazy import is still one)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            # `from ftrun.agent import procs` imports the submodule ftrun.agent.procs
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known)
    return {m for m in found if m in known and m != module}


@functools.cache
def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def test_imports_point_one_way() -> None:
    upward = []
    for module, targets in graph().items():
        if module == "ftrun.__main__":
            continue
        part = part_of(module)
        for target in sorted(targets):
            if part_of(target) in FORBIDDEN.get(part, set()):
                upward.append(f"{module} ({part}) imports {target} ({part_of(target)})")
    assert upward == []


def test_no_import_loop() -> None:
    """Tarjan's strongly connected components: any component of more than one module is a loop.
    A package's __init__ that re-exports its own submodules is not a loop to report."""
    edges = {
        m: {t for t in ts if not (m.startswith(t + ".") and t != "ftrun")}
        for m, ts in graph().items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    assert loops == []


def test_the_rules_cover_the_tree() -> None:
    """The rules are not vacuous: the real tree has modules in every layer, and an import from
    the ground floor up into the controller, or from checkpoint into the agent, is forbidden."""
    parts = {part_of(m) for m in modules()}
    assert {"cli", "controller", "transport", "agent", "ground", "checkpoint", "peercopy"} <= parts
    assert parts <= set(FORBIDDEN), "a part without rules: say where it may import from"
    assert part_of("ftrun.config") == "ground" and part_of("ftrun.controller.fleet") == "controller"
    assert "controller" in FORBIDDEN["ground"] and "agent" in FORBIDDEN["checkpoint"]
    assert "agent" not in FORBIDDEN["controller"] and "ground" not in FORBIDDEN["agent"]


@pytest.mark.parametrize(
    "module",
    [
        "ftrun.controller.supervisor",
        "ftrun.agent.agent",
        "ftrun.agent.__main__",
        "ftrun.jobview",
        "ftrun",
    ],
)
def test_core_modules_import_no_torch_or_ui(module: str) -> None:
    code = (
        f"import sys, {module}; bad = [m for m in ('torch', 'typer', 'rich') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_only_the_cli_imports_typer_or_rich() -> None:
    offenders = []
    for module, path in modules().items():
        if part_of(module) == "cli":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{module}: {n}" for n in names if n.split(".")[0] in ("typer", "rich")]
    assert offenders == []


MAX_LINES = 350  # STYLE.md: small modules, one concept each (issue 35)


def test_no_module_is_over_the_size_of_one_concept() -> None:
    sizes = {module: len(path.read_text().splitlines()) for module, path in modules().items()}
    assert len(sizes) > 100  # the rule covers the tree, not an empty listing
    assert {m: n for m, n in sizes.items() if n > MAX_LINES} == {}
