"""Sizes as people write them: 16GiB, 512MiB, 1.5GB, 4096 (bytes). One parser for every flag and
file that takes a size, so `--device-memory 16GiB` means the same to `ftrun plan` and `launch`."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in `text`; ValueError with the reason when it is not a size."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size (e.g. 16GiB, 512MiB, 1.5GB or bytes)")
    value = float(match.group(1)) * _UNITS[unit]
    if value < 1:
        raise ValueError(f"{text!r} is less than a byte")
    return int(value)


def format_size(n: float) -> str:
    """1610612736 → 1.5 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
