"""Shared fixtures: run `ftrun` as a real subprocess, and prove no process outlives a test.

Every process a test starts carries FTRUN_TEST_ID in its environment (forks of the warm
interpreter keep their parent's environment block, so they carry it too); after each test the
`no_survivors` fixture finds any that are still alive, kills them, and fails the test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from ftrun.agent import workdir
from tests.slurmbed import SlurmBed, slurm_bed_fixture
from tests.testbed import Testbed, ssh_testbed_fixture

# Every torch process of the suite (the workers' own, ranks, persist workers, references) computes
# on one thread, as torchrun's ranks do by default. With torch's default of one per core, two
# workers' processes oversubscribed the 2 cores and OpenMP's spinning waits took CPU from the
# other worker: the live-snapshot unit tests spent 62 s of CPU on 2 workers, 47 s on one thread.
# Set before anything imports torch; the xdist workers and every process they start inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

BIN = Path(__file__).parent / "bin"
TESTS = Path(__file__).resolve().parent
# The tiers (scripts/test.sh --fast runs the first alone). A test's tier follows from where it
# lives and what it asks for, so that a new test cannot land in the fast tier by forgetting a mark.
PROCESS_DIRS = (TESTS / "integration", TESTS / "conformance", TESTS / "hostile" / "live")
TESTBED_FIXTURES = {"testbed", "bed", "slurm"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`ranks`: starts real agents, torchrun or torch ranks. `testbed`: also needs the ssh hosts
    in network namespaces or the Slurm testbed (root). Unmarked: pure logic and in-process
    tests, seconds in all."""
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if any(path.is_relative_to(d) for d in PROCESS_DIRS):
            item.add_marker(pytest.mark.ranks)
        if TESTBED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.testbed)
    if TESTBED_IDS in os.environ:  # an xdist worker: tell the controller's scheduler
        ids = [item.nodeid for item in items if own_testbed(item)]
        partial = Path(f"{os.environ[TESTBED_IDS]}.{os.getpid()}")
        partial.write_text(json.dumps(ids))
        partial.replace(os.environ[TESTBED_IDS])  # every worker writes the same list


def own_testbed(item: pytest.Item) -> bool:
    """Whether the test's module brings up a testbed of its own (a module-level `testbed` or
    `slurm` fixture) rather than using its worker's (below): those have fixed names and subnets,
    which another such module may share."""
    module = getattr(item, "module", None)
    return item.get_closest_marker("testbed") is not None and any(
        name in getattr(item, "fixturenames", ()) and hasattr(module, name)
        for name in ("testbed", "slurm")
    )


# -- the testbeds: one ssh testbed and one Slurm bed per process, shared by its tests -------------
# Each is brought up once, the first time a test asks for it (a few seconds), and torn down at the
# end, checked to leave nothing behind. Each test gets it reset: every host (node) up, connected,
# with nothing of the test before on it; a test cannot see what the one before did. Five hosts:
# what the largest user needs (test_replay). Each xdist worker has its own pair, on the worker's
# own names, subnet and ports (tests/testbed.py's worker_network), so testbed tests run on both.
session_testbed = ssh_testbed_fixture(5, name="session_testbed")
session_slurm = slurm_bed_fixture(4, name="session_slurm")


@pytest.fixture
def testbed(session_testbed: Testbed) -> Iterator[Testbed]:
    session_testbed.reset()
    yield session_testbed
    session_testbed.reset()


@pytest.fixture
def slurm(session_slurm: SlurmBed) -> Iterator[SlurmBed]:
    session_slurm.reset()
    try:
        yield session_slurm
    finally:
        session_slurm.reset()
        # A powered-off node's agent could not remove its directory; the next agent on the
        # host would (the product's way), but the suite leaves nothing behind.
        sweep_stale_agent_dirs()


# -- pytest-xdist: scripts/test.sh runs the suite on 2 workers ------------------------------------
# The tests that start ranks wait on timeouts and child processes more than they compute (60 % of
# the CPU idle on 2 cores), so two workers nearly halve the suite. Testbed tests run on either
# worker, each on its worker's testbeds; but the tests of modules that bring up a testbed of their
# own (fixed names and subnets) run on one worker, one after the other. xdist's own `xdist_group`
# does not work under pytest 9 (it renames the test's `_nodeid`, which pytest 9 no longer reads),
# so the scheduler here groups them: the workers write those tests' ids to a file while they
# collect, which the controller's scheduler reads once every worker has reported its collection.
TESTBED_IDS = "FTRUN_TESTS_TESTBED_IDS"


def pytest_configure(config: pytest.Config) -> None:
    """The controller of an xdist run: the file the workers write the testbed tests' ids to."""
    if "PYTEST_XDIST_WORKER" not in os.environ and getattr(config.option, "numprocesses", None):
        fd, name = tempfile.mkstemp(prefix="ftrun-tests-testbed-ids-")
        os.close(fd)
        os.environ[TESTBED_IDS] = name  # the workers inherit it
        config.add_cleanup(lambda: Path(name).unlink(missing_ok=True))


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown without it (FTRUN_TEST_WORKERS=0)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class TestbedsInTurn(LoadScopeScheduling):
        """Every test is its own unit of work, but the tests on testbeds of their own modules',
        which are one."""

        _testbed: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._testbed is None:
                self._testbed = set(json.loads(Path(os.environ[TESTBED_IDS]).read_text() or "[]"))
            return "testbed" if nodeid in self._testbed else nodeid

    return TestbedsInTurn(config, log)


SYSTEM_TMP = Path(tempfile.gettempdir())  # read before any worker has its own


def sweep_stale_agent_dirs() -> None:
    """Remove the directories of agents that died without removing them (a SIGKILLed host's):
    the next agent on the host would, the product's way, but the suite leaves nothing behind.
    In this worker's temp dir and in the system's: agents on the ssh testbed's hosts do not
    inherit TMPDIR."""
    for parent in {SYSTEM_TMP, Path(tempfile.gettempdir())}:
        workdir.sweep_stale(parent)


@pytest.fixture(scope="session", autouse=True)
def worker_tmpdir(tmp_path_factory: pytest.TempPathFactory):
    """Under pytest-xdist, each worker's processes keep their temp files (torchrun's
    torchelastic_* dirs, agents' workdirs) in a temp dir of the worker's own, so that what one
    test checks was left behind is only its own worker's. Removed at the end."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield None
        sweep_stale_agent_dirs()
        return
    path = Path(tempfile.mkdtemp(prefix=f"ftrun-tests-{os.environ['PYTEST_XDIST_WORKER']}-"))
    before = tempfile.tempdir
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(path))
        tempfile.tempdir = str(path)
        try:
            yield path
        finally:
            sweep_stale_agent_dirs()
            tempfile.tempdir = before
            shutil.rmtree(path, ignore_errors=True)


def tagged(test_id: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if (
                proc.environ().get("FTRUN_TEST_ID") == test_id
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def wait_for(predicate, timeout_s: float, what: str | Callable[[], str], interval_s: float = 0.05):
    """Poll `predicate` until it is truthy; else fail saying `what` (a callable: what it says
    at the deadline, e.g. the output so far)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    said = what() if callable(what) else what
    raise AssertionError(f"timed out after {timeout_s} s waiting for {said}")


class Ftrun:
    """Runs the real `ftrun` CLI in a subprocess with a per-test run dir and tag."""

    def __init__(self, run_dir: Path, test_id: str) -> None:
        self.run_dir = run_dir
        self.env = {
            **os.environ,
            "FTRUN_TEST_ID": test_id,
            "FTRUN_RUN_DIR": str(run_dir),
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "200",
            # Each test's own quarantine store (ftrun/quarantine.py): a host one test's job
            # quarantined is not left out of the next test's.
            "FTRUN_QUARANTINE_FILE": str(run_dir.parent / "quarantine.json"),
        }

    def run(
        self,
        *args: str,
        timeout: float = 90,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ftrun", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.env, **(env or {})},
            cwd=cwd,
        )

    def start(self, *args: str, cwd: str | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "ftrun", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            cwd=cwd,
            start_new_session=True,
        )

    def status_json(self, job: str | None = None) -> Any:
        result = self.run("status", *([job] if job else []), "--json", timeout=30)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def only_job(self) -> dict[str, Any]:
        jobs = self.status_json()
        assert len(jobs) == 1, jobs
        return self.status_json(jobs[0]["job_id"])

    def job_id(self, timeout_s: float = 30) -> str:
        """The id of the test's one job, once its journal is in the run dir (what `status`
        lists), read from there: polling `ftrun status` spawned a CLI (0.2-0.5 s of CPU) a try."""

        def jobs() -> list[str]:
            if not self.run_dir.is_dir():
                return []
            return [p.name for p in self.run_dir.iterdir() if (p / "events.jsonl").is_file()]

        found = wait_for(jobs, timeout_s, "the job's journal in the run dir")
        assert len(found) == 1, found
        return found[0]

    def events(self, job_id: str) -> list[dict[str, Any]]:
        path = self.run_dir / job_id / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session", autouse=True)
def config_home(tmp_path_factory: pytest.TempPathFactory):
    """A rank outside `ftrun launch` keeps its checkpoint key in $XDG_CONFIG_HOME/ftrun
    (ftrun/checkpoint/auth.py): the tests' ranks and every process they start keep theirs in a
    temp dir, never in the real home."""
    path = tmp_path_factory.mktemp("config-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(path))
        # ... and the quarantine store ($XDG_STATE_HOME/ftrun), for what no Ftrun fixture runs
        patch.setenv("XDG_STATE_HOME", str(path / "state"))
        yield path


@pytest.fixture
def test_id() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def ftrun(tmp_path: Path, test_id: str, no_survivors: None) -> Ftrun:
    return Ftrun(tmp_path / "runs", test_id)


def torchrun_temp_dirs() -> set[str]:
    """What torchrun leaves in the temp dir when it is not given --log-dir."""
    return {p.name for p in Path(tempfile.gettempdir()).glob("torchelastic_*")}


@pytest.fixture
def no_survivors(test_id: str):
    before = torchrun_temp_dirs()
    yield
    left_dirs = torchrun_temp_dirs() - before
    assert not left_dirs, f"torchrun temp dirs left behind: {sorted(left_dirs)}"
    try:
        wait_for(lambda: not tagged(test_id), 5.0, "the test's processes to exit")
    except AssertionError:
        left = tagged(test_id)
        desc = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left]
        for p in left:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        pytest.fail(f"processes survived the test: {desc}")


class Output:
    """Collects a Popen's output on a thread so a test can wait for a line without blocking."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        import threading

        self.proc = proc
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout_s: float = 60) -> None:
        wait_for(
            lambda: any(text in line for line in self.lines),
            timeout_s,
            lambda: f"{text!r} in the output (so far: {''.join(self.lines)[-2000:]})",
        )

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "".join(self.lines)


async def spawn_agent(boot: dict[str, Any], log_path: Path, test_id: str) -> Any:
    """Start a real `python -m ftrun.agent` with this bootstrap on its stdin (as a transport
    does), its output in log_path, tagged for the no_survivors check."""
    import asyncio

    with open(log_path, "wb") as log:
        agent = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ftrun.agent",
            stdin=asyncio.subprocess.PIPE,
            stdout=log,
            stderr=log,
            env={**os.environ, "FTRUN_TEST_ID": test_id},
        )
    agent.stdin.write(json.dumps(boot).encode() + b"\n")
    return agent
