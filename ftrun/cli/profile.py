"""`ftrun profile SCRIPT [ARGS]...`: measure a script's layers for the planner (profile.json).

The script runs once, as one plain process of the same interpreter with a single-rank
torch.distributed environment and $FTRUN_PROFILE_OUT set; its call into ftrun.parallel measures
every layer, writes the file and exits 0 instead of training (ftrun/parallel/profile.py). This
command only runs it, bounds it with a timeout, checks what came back and shows it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from ftrun import envcontract
from ftrun.cli.render import make_console
from ftrun.errors import FtrunError, UsageError
from ftrun.netutil import LOOPBACK, free_port
from ftrun.outputs import write_output

console = make_console()


def profile(
    script: str = typer.Argument(..., metavar="SCRIPT", help="The training script."),
    script_args: list[str] | None = typer.Argument(
        None, metavar="[ARGS]...", help="Arguments for the script (its model and batch)."
    ),
    out: Path = typer.Option(
        Path("profile.json"), "--out", "-o", help="Where to write the profile."
    ),
    timeout: float = typer.Option(
        600.0, "--timeout", help="Seconds the profiling run may take.", min=1.0
    ),
) -> None:
    """Profile a script's layers (time, memory) into profile.json for `ftrun plan`.
    Options go before SCRIPT: what follows it is the script's."""
    args = list(script_args or ())
    path = Path(script)
    if not path.is_file():
        raise UsageError(f"no such script: {script}")
    out = Path(os.path.abspath(out))
    # The script writes into a directory of ours alone; `out` gets the checked bytes, renamed
    # into place (ftrun/outputs.py): its directory may be one that other users can write.
    work = Path(tempfile.mkdtemp(prefix="ftrun-profile-"))
    tmp = work / "profile.json"
    by_hand = (
        f"{envcontract.PROFILE_OUT}={shlex.quote(str(out))} python {shlex.join([script, *args])}"
    )
    try:
        code, output = _run([sys.executable, script, *args], _env(tmp), timeout)
        if code != 0:
            last = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
            raise FtrunError(
                f"the profiling run of {script} failed (exit {code}): {last[0].strip()}",
                hint=f"run it by hand to see everything: {by_hand}",
            )
        if not tmp.exists():
            raise FtrunError(
                f"{script} exited without writing a profile: it does not train through "
                "ftrun.parallel.Parallel",
                hint="build the model with ftrun.parallel.Parallel(...) (see "
                "recipes/gpt_pipeline.py); it profiles when $FTRUN_PROFILE_OUT is set",
            )
        doc = _check(tmp)
        try:
            write_output(out, tmp.read_bytes(), flag="--out")
        except OSError as e:
            raise UsageError(
                f"cannot write --out {out}: {e.strerror or e}",
                hint="pick a file in a directory you can write, e.g. --out ./profile.json",
            ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    console.print(_table(doc))
    device = doc.get("device") or {}
    if device.get("reduce_bytes_per_s"):
        console.print(
            f"the device reduces {device['reduce_bytes_per_s'] / 1e6:.0f} MB/s of all-reduce "
            f"traffic (gloo on its CPU, at {device.get('cpu_share', 1.0):.2f} of a core)"
        )
    console.print(
        f"wrote {out} ({len(doc['layers'])} layers, global batch {doc.get('global_batch')}, "
        f"memory budget {_mib(doc.get('device_memory_bytes'))})"
    )


def _env(out: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != envcontract.PLAN}
    env.update(
        {
            envcontract.PROFILE_OUT: str(out),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": LOOPBACK,
            "MASTER_PORT": str(free_port()),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run in its own session; on timeout, ^C or SIGTERM kill its whole group and reap it."""
    previous = signal.signal(signal.SIGTERM, _terminated)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FtrunError(
            f"the profiling run took longer than {timeout:.0f} s and was killed",
            hint="profile a smaller configuration, or give more time with --timeout",
        ) from None
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate(timeout=30)
        signal.signal(signal.SIGTERM, previous)
    return proc.returncode, output


def _check(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
        layers = doc["layers"]
        assert isinstance(layers, list) and layers
        for layer in layers:
            assert isinstance(layer["name"], str) and len(layer["fwd_s"]) == 2
            assert len(layer["bwd_s"]) == 2 and layer["state_bytes"] >= 0
    except (ValueError, KeyError, TypeError, AssertionError):
        raise FtrunError(
            f"the profile the script wrote is not a valid profile.json ({path})",
            hint="it must be written by ftrun.parallel (contract version 1)",
        ) from None
    return dict(doc)


def _mib(n: int | None) -> str:
    return "none" if n is None else f"{n / 2**20:.1f} MiB"


def _ms(fit: list[float]) -> str:
    return f"{fit[0] * 1e3:.3f} + {fit[1] * 1e3:.4f}·m"


def _table(doc: dict[str, Any]) -> Table:
    table = Table(title=f"profile of {doc.get('model', '?')} (times in ms, m = micro-batch)")
    columns = ("layer", "forward", "backward", "optimizer", "state", "activations/sample")
    for name in (*columns, "out/sample"):
        table.add_column(name, justify="left" if name == "layer" else "right")
    for layer in doc["layers"]:
        table.add_row(
            layer["name"],
            _ms(layer["fwd_s"]),
            _ms(layer["bwd_s"]),
            f"{layer.get('opt_s', 0.0) * 1e3:.3f}",
            _mib(layer["state_bytes"]),
            f"{layer['act_bytes'] / 1024:.1f} KiB",
            f"{layer['out_bytes'] / 1024:.1f} KiB",
        )
    return table


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_interspersed_args": False})(profile)
