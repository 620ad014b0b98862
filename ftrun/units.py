"""Byte sizes as people write them (`16GiB`, `512MiB`, `1.5e9`) and as ftrun prints them.

One parser for every size ftrun reads (`--device-memory`, `ftrun plan`, a recipe's
`--memory-budget` through ftrun.parallel), so a size means the same everywhere. Ground floor:
the planner, the controller and the ranks all import it.
"""

from __future__ import annotations

import math
import re

# Binary units are what device memory is sold in, and a bare K/M/G/T is binary too (as `ulimit`
# and `docker --memory` read it); KB/MB/GB/TB are decimal.
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*")


MAX_SIZE = float(1 << 60)  # 1 EiB: past any device or host memory, and far from float's end


def parse_size(text: str) -> int:
    """`16GiB` → 17179869184 bytes; `512MiB`, `4GB`, `1e9` and plain byte counts too.

    Raises ValueError with the accepted forms when `text` is none of them.
    """
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size: write bytes (1073741824) or a number with a unit "
            "(512MiB, 16GiB, 4GB)"
        )
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value >= MAX_SIZE:
        raise ValueError(f"{text!r} is not a size a machine has (at most 1 EiB)")
    size = int(value)
    if size <= 0:
        raise ValueError(f"{text!r} is not a positive size")
    return size


def format_bytes(size: float) -> str:
    """17179869184 → `16.0 GiB`; 1536 → `1.5 KiB`; 100 → `100 B`."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
