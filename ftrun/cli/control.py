"""Talking to a running job's controller from the CLI (`ftrun chaos`, `ftrun hosts`).

The controller writes its address and the job secret to `<job>/control.json` (mode 0600); a
client authenticates with it like an agent would, sends one request, and reads one reply.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from ftrun.errors import ProtocolError, UsageError
from ftrun.wire.protocol import open_channel

REPLY_TIMEOUT_S = 10.0


def ask(job_dir: Path, kind: str, reply_kind: str, **request: Any) -> tuple[bool, str]:
    """Send one request to the job's controller; (ok, message) from its reply."""
    try:
        control = json.loads((job_dir / "control.json").read_text())
    except (OSError, ValueError):
        raise UsageError(
            f"job {job_dir.name} is not running", hint=f"`ftrun status {job_dir.name}`"
        ) from None
    return asyncio.run(_request(control, kind, reply_kind, request))


async def _request(
    control: dict[str, Any], kind: str, reply_kind: str, request: dict[str, Any]
) -> tuple[bool, str]:
    try:
        chan = await open_channel(
            control["host"],
            control["port"],
            control["secret"],
            timeout_s=REPLY_TIMEOUT_S,
            cert_pem=control.get("cert") or "",
        )
        chan.send("hello", role="client")
        chan.send(kind, **request)
        await chan.drain(REPLY_TIMEOUT_S)
        reply = await asyncio.wait_for(chan.receive(), REPLY_TIMEOUT_S)
        while reply["kind"] not in (reply_kind, "refused"):
            reply = await asyncio.wait_for(chan.receive(), REPLY_TIMEOUT_S)
        chan.close()
        if reply["kind"] == "refused":
            return False, f"the controller refused the request: {reply['message']}"
        return bool(reply.get("ok")), str(reply.get("message"))
    except (
        OSError,
        asyncio.TimeoutError,
        asyncio.IncompleteReadError,
        ProtocolError,
        KeyError,
    ) as e:
        return False, f"could not reach the controller ({e.__class__.__name__}: {e})"
