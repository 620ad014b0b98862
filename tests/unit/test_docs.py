"""Docs that restate the code: checked against it, so they cannot drift apart again."""

from __future__ import annotations

import re
from pathlib import Path

from ftrun.envcontract import FORWARD_NAMES, FORWARD_PREFIXES

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _listed(text: str, lead: str) -> set[str]:
    """The `code` items of the list item that starts with `lead` (continued lines included)."""
    match = re.search(rf"^- {re.escape(lead)}(.*?)(?=^- |^\s*$)", text, re.M | re.S)
    assert match, f"docs/multihost.md has no list item starting {lead!r}"
    return set(re.findall(r"`([^`]+)`", match.group(1)))


def test_multihost_doc_lists_the_forwarded_variables_fleet_forwards():
    text = (DOCS / "multihost.md").read_text()
    assert _listed(
        text, "by default, the launching machine's variables with names starting with:"
    ) == set(FORWARD_PREFIXES)
    assert _listed(text, "and these names:") == set(FORWARD_NAMES)
