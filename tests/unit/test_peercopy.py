"""The peer tier (ftrun/peercopy) with real snapshots, real sockets and real files: a rank's memory
snapshots are pushed to a peer's store, the rank's host is lost, a spare fetches the replica and
restores from memory, bit for bit; a zombie generation's pushes are refused; a snapshot rewritten
while it is sent is never kept torn; the controller's ring and takeover plan."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from ftrun.checkpoint.config import memory_tier_dir
from ftrun.controller.peer_plan import peer_fields
from ftrun.errors import ProtocolError
from ftrun.peercopy import files, wire
from ftrun.peercopy.fetch import fetch
from ftrun.peercopy.replicator import Replicator
from ftrun.peercopy.store import MAX_UNAUTHENTICATED as MAX_UNAUTH
from ftrun.peercopy.store import PeerStore
from ftrun.wire.messages import Role
from ftrun.wire.protocol import accept_channel, new_secret, open_channel
from tests.conftest import wait_for
from tests.integration.ckpt_helpers import Managers, Toy, assert_same

TIMEOUT_S = 30


@pytest.fixture
def managers(tmp_path):
    made = Managers(tmp_path)
    yield made
    made.cleanup()


def tier(root: Path, job: str) -> Path:
    return memory_tier_dir(job, root)


def trained(managers: Managers, root: Path, steps: int, width: int = 8) -> tuple[Toy, object]:
    """A rank on host `root` that snapshotted steps 1..steps into its memory tier."""
    toy = Toy(seed=0, width=width)
    mgr = managers(memory_root=root, generation=1, owner=managers.job)
    mgr.restore(toy.state)
    for step in range(1, steps + 1):
        toy.step()
        mgr.save(step, toy.state)
    mgr.wait_snapshot()  # the copy is done; the manifest follows it
    directory = files.rank_dir(tier(root, managers.job), 0)
    wait_for(lambda: [s.step for s in files.snapshots(directory, 0)][:1] == [steps], 30, "it")
    return toy, mgr


async def until(predicate, what: str) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(poll(), TIMEOUT_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def test_a_spare_restores_a_lost_hosts_rank_from_its_peers_memory(managers, tmp_path):
    host_a, host_b, spare = tmp_path / "a", tmp_path / "b", tmp_path / "s"
    toy, mgr = trained(managers, host_a, steps=4)
    saved = toy.tensors()
    mgr.close(persist_last=False)
    reference = [toy.step() for _ in range(3)]  # the run that never stopped (the global RNG too)
    secret, job = new_secret(), managers.job

    async def scenario() -> dict:
        store = PeerStore(tier=tier(host_b, job), secret=secret, job_id=job, newest_gen=lambda: 1)
        port = await store.start()
        running = True
        replicator = Replicator(
            tier=tier(host_a, job), ranks=[0], gen=1, host="a", peer=("127.0.0.1", port),
            secret=secret, rate=0, running=lambda: running,
        )  # fmt: skip
        task = asyncio.ensure_future(replicator.run())
        replica = files.replica_dir(tier(host_b, job), 0)
        await until(lambda: [s.step for s in files.snapshots(replica, 0)][:1] == [4], "step 4")
        running = False
        await asyncio.wait_for(task, TIMEOUT_S)
        shutil.rmtree(host_a)  # host a is lost, and its memory with it
        source = {"addr": "127.0.0.1", "port": port, "which": "replica", "ranks": [0]}
        report = await fetch(source, tier=tier(spare, job), gen=2, host="s", secret=secret)
        store.close()
        return report

    report = asyncio.run(scenario())
    assert "error" not in report, report
    assert report["snapshots"] == [[0, 4, 1]]  # the newest is pushed, not the ones before it
    fresh = Toy(seed=7)
    again = managers(memory_root=spare, generation=2, owner=managers.job)
    assert again.restore(fresh.state) == 4 and again.restored.tier == "memory"
    assert_same(fresh.tensors(), saved)
    assert [fresh.step() for _ in range(3)] == reference


def test_a_joining_host_fetches_the_newest_snapshot_from_a_hosts_own_memory_as_a_replica(
    managers, tmp_path
):
    """A grow: the joining host asks an old host for its rank 0 ("primary", into its replica
    directory, the newest only: it keeps them on top of its own ranks' slots)."""
    old_host, joining = tmp_path / "a", tmp_path / "d"
    toy, mgr = trained(managers, old_host, steps=3)
    held = [s.step for s in files.snapshots(files.rank_dir(tier(old_host, managers.job), 0), 0)]
    assert len(held) >= 2 and held[0] == 3, held  # more than one to choose from
    secret, job = new_secret(), managers.job

    async def scenario() -> dict:
        store = PeerStore(tier=tier(old_host, job), secret=secret, job_id=job, newest_gen=lambda: 2)
        port = await store.start()
        source = {"addr": "127.0.0.1", "port": port, "which": "primary", "ranks": [0]}
        report = await fetch(
            {**source, "into": "replica"}, tier=tier(joining, job), gen=2, host="d", secret=secret
        )
        store.close()
        return report

    report = asyncio.run(scenario())
    assert "error" not in report and report["snapshots"] == [[0, 3, 1]], report
    assert not files.rank_dir(tier(joining, job), 0).exists()  # not under its own ranks' names
    kept = files.snapshots(files.replica_dir(tier(joining, job), 0), 0)
    assert [(s.step, s.generation) for s in kept] == [(3, 1)]
    mgr.close(persist_last=False)


def test_a_joining_hosts_fetch_takes_the_snapshots_that_cover_every_tensor(managers, tmp_path):
    """Data parallel (every rank holds the same tensors): the first rank's snapshot alone.
    Pipeline stages (other tensors): one per stage. Real manifests of real snapshots."""
    elsewhere = Managers(tmp_path / "elsewhere")  # its own storage: other shapes do not load
    try:
        _, one = trained(managers, tmp_path / "a", steps=2, width=8)
        _, other = trained(elsewhere, tmp_path / "b", steps=2, width=16)  # a stage's tensors
        one.close(persist_last=False)
        other.close(persist_last=False)
        a, b = (
            files.snapshots(files.rank_dir(tier(tmp_path / h, made.job), 0), 0)[0]
            for h, made in (("a", managers), ("b", elsewhere))
        )
    finally:
        elsewhere.cleanup()
    same = dataclasses.replace(a, rank=1)  # rank 1 of a data-parallel job: rank 0's tensors
    assert files.tensor_keys(a) and files.tensor_keys(a) == files.tensor_keys(same)
    assert files.covering([a, same]) == [a]
    assert files.covering([a, dataclasses.replace(b, rank=1)]) == [
        a,
        dataclasses.replace(b, rank=1),
    ]
    unreadable = dataclasses.replace(a, rank=2, manifest=b"{}")
    assert files.covering([a, unreadable]) == [a, unreadable]  # never dropped unread
    # A rank's PerRank tensors are its own: another layout never restores them, so they do not
    # make its snapshot worth sending.
    body = json.loads(a.manifest)
    body["tensors"].append(["__rank3__.data.noise", "float32", [4], 0, 16])
    own = dataclasses.replace(a, rank=3, manifest=json.dumps(body).encode())
    assert files.covering([a, own]) == [a]


def test_a_zombie_generations_pushes_are_refused(managers, tmp_path):
    _, mgr = trained(managers, tmp_path / "a", steps=2)
    mgr.close(persist_last=False)
    secret, job = new_secret(), managers.job
    peer = tier(tmp_path / "b", job)

    async def scenario() -> tuple[int, float]:
        store = PeerStore(tier=peer, secret=secret, job_id=job, newest_gen=lambda: 2)
        port = await store.start()
        replicator = Replicator(
            tier=tier(tmp_path / "a", job), ranks=[0], gen=1, host="a",
            peer=("127.0.0.1", port), secret=secret, rate=0, running=lambda: True,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.wait_for(replicator.run(), TIMEOUT_S)  # ends by itself: refused
        store.close()
        return store.refused, loop.time() - t0

    refused, _ = asyncio.run(scenario())
    assert refused == 1
    assert files.snapshots(files.replica_dir(peer, 0), 0) == []


def test_a_snapshot_rewritten_while_it_is_sent_is_dropped_and_the_older_one_kept(
    managers, tmp_path
):
    _, mgr = trained(managers, tmp_path / "a", steps=2, width=512)  # ~3 MiB: several frames
    source = files.rank_dir(tier(tmp_path / "a", managers.job), 0)
    newest, older = files.snapshots(source, 0)
    assert (newest.step, older.step) == (2, 1) and newest.data_size > 2 * files.CHUNK
    secret = new_secret()

    class RewrittenMidway(wire.Pacer):
        """After the first chunk, the rank starts its next snapshot into this slot."""

        def __init__(self) -> None:
            super().__init__(0)
            self.calls = 0

        async def take(self, n: int) -> None:
            self.calls += 1
            if self.calls == 2:
                files.paths(source, newest.slot)[2].unlink()

    async def scenario(replica: Path) -> list[object]:
        outcomes: list[object] = []
        ended = asyncio.get_running_loop().create_future()

        async def serve(reader, writer) -> None:
            chan = await accept_channel(reader, writer, secret)
            chan.trust(Role.PEER)
            try:
                while True:
                    header = await chan.receive()
                    outcomes.append(await wire.receive_snapshot(chan, header, replica))
            except Exception as e:  # noqa: BLE001 - the test looks at it
                outcomes.append(e)
            chan.close()
            ended.set_result(None)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        chan = await open_channel("127.0.0.1", port, secret, 5, server=Role.PEER)
        await wire.send_snapshot(chan, source, older, wire.Pacer(0))
        with pytest.raises(wire.SourceChanged):
            await wire.send_snapshot(chan, source, newest, RewrittenMidway())
        chan.close()  # what the replicator does: the receiver is left waiting for data
        await asyncio.wait_for(ended, TIMEOUT_S)
        server.close()
        return outcomes

    replica = tmp_path / "replica"
    kept, cut = asyncio.run(scenario(replica))
    assert isinstance(kept, files.Snapshot) and kept.step == 1
    assert isinstance(cut, asyncio.IncompleteReadError), cut
    assert [s.step for s in files.snapshots(replica, 0)] == [1]  # the older one, whole
    mgr.close(persist_last=False)


def test_an_arriving_snapshot_never_replaces_the_newest_one_held(tmp_path):
    """files.slot_for: an empty slot first, else the oldest, and only for something newer."""

    def hold(slot: int, step: int) -> None:
        data, objects, manifest = files.paths(tmp_path, slot)
        files.ensure_dir(tmp_path)
        body = {"rank": 0, "step": step, "generation": 1, "data_size": 0}
        for path, content in ((data, b""), (objects, b""), (manifest, json.dumps(body).encode())):
            path.write_bytes(content)
            path.chmod(0o600)

    assert files.slot_for(tmp_path, 0, (5, 1)) == 0
    hold(0, 5)
    assert files.slot_for(tmp_path, 0, (4, 1)) == 1  # room for an older one too
    hold(1, 4)
    assert files.slot_for(tmp_path, 0, (6, 1)) == 1  # the oldest goes
    assert files.slot_for(tmp_path, 0, (3, 1)) is None  # older than both: not kept
    assert files.slot_for(tmp_path, 0, (5, 1)) is None  # held already
    assert files.slot_for(tmp_path, 0, (2, 2)) == 1  # a newer generation's: the timeline now


def test_a_blob_with_a_bad_tag_or_out_of_order_is_refused():
    secret = new_secret()

    async def scenario(tamper: str) -> None:
        received: asyncio.Future = asyncio.get_running_loop().create_future()

        async def serve(reader, writer) -> None:
            chan = await accept_channel(reader, writer, secret)
            try:
                received.set_result(await chan.receive_blob())
            except Exception as e:  # noqa: BLE001 - the test looks at it
                received.set_result(e)
            chan.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        chan = await open_channel("127.0.0.1", port, secret, 5, server=Role.PEER)
        if tamper == "message":
            chan.send("end", ok=True)  # a message where a blob is due
        else:
            chan._sent_seq += 1  # a blob whose number is not the next: a replay or a drop
            chan.send_blob(b"x" * 100)
        result = await asyncio.wait_for(received, TIMEOUT_S)
        chan.close()
        server.close()
        assert isinstance(result, ProtocolError), result

    for tamper in ("message", "sequence"):
        asyncio.run(scenario(tamper))


@pytest.mark.parametrize(
    "agents, previous, up, expected_fetch",
    [
        # the spare s takes the lost b's node rank: b's ranks are in c's replica
        (["a", "s", "c"], ["a", "b", "c"], "asc", {1: ("c", "replica", [2, 3])}),
        # node rank 0 lost too: its replica is on node rank 1
        (["s", "b", "c"], ["a", "b", "c"], "sbc", {0: ("b", "replica", [0, 1])}),
        # the old host is still up (its ranks moved): from its own memory
        (["b", "a"], ["a", "b"], "ab", {0: ("a", "primary", [0, 1]), 1: ("b", "primary", [2, 3])}),
        # b and c both lost: c's replica is on a (the ring wraps), b's was on c: gone with it
        (["a", "s", "t"], ["a", "b", "c"], "ast", {2: ("a", "replica", [4, 5])}),
        # another number of nodes, no host new: the survivors reshard from their own memory
        (["a", "c"], ["a", "b", "c"], "ac", {}),
        # a grow: the joining host d (node rank 2 of 3) fetches old node 2 % 2 = 0's ranks
        (["a", "b", "d"], ["a", "b"], "abd", {2: ("a", "primary", [0, 1])}),
        # two hosts join one: each fetches the one old node's ranks
        (["a", "d", "e"], ["a"], "ade", {1: ("a", "primary", [0, 1]), 2: ("a", "primary", [0, 1])}),
        # the same hosts: every rank's snapshots are where it runs
        (["a", "b", "c"], ["a", "b", "c"], "abc", {}),
    ],
)
def test_the_ring_and_where_a_newcomer_fetches(agents, previous, up, expected_fetch):
    where = {a: (f"10.0.0.{ord(a)}", 1000 + ord(a)) for a in up}
    fields = peer_fields(agents, previous, where, nproc_per_node=2, rate_bytes_s=1e9)
    n = len(agents)
    assert [f["to"] for f in fields] == [list(where[agents[(i + 1) % n]]) for i in range(n)]
    got = {
        i: (chr(f["fetch"][0]["port"] - 1000), f["fetch"][0]["which"], f["fetch"][0]["ranks"])
        for i, f in enumerate(fields)
        if f["fetch"]
    }
    assert got == expected_fetch
    for i, f in enumerate(fields):  # a joining host keeps what it fetches as replicas
        grown = len(previous) != n
        assert all((s.get("into") == "replica") == grown for s in f["fetch"]), (i, f)


def test_a_joining_host_falls_back_to_the_other_old_hosts_that_are_up():
    where = {a: (f"10.0.0.{ord(a)}", 1000 + ord(a)) for a in "bcde"}  # old node a is gone
    agents, previous = ["b", "c", "d", "e"], ["a", "b", "c"]
    fields = peer_fields(agents, previous, where, nproc_per_node=1, rate_bytes_s=1)
    sources = [[(chr(s["port"] - 1000), s["ranks"]) for s in f["fetch"]] for f in fields]
    # d at node rank 2 takes old node 2 (c) first, then wraps past the missing a to b; e at 3
    # starts at old node 0, a, which is gone. b and c hold their own.
    assert sources == [[], [], [("c", [2]), ("b", [1])], [("b", [1]), ("c", [2])]]


def test_no_ring_for_one_host_or_a_zero_rate():
    where = {"a": ("10.0.0.1", 1), "b": ("10.0.0.2", 2)}
    assert peer_fields(["a"], [], where, nproc_per_node=1, rate_bytes_s=1e9)[0]["to"] is None
    off = peer_fields(["a", "b"], ["a", "c"], where, nproc_per_node=1, rate_bytes_s=0)
    assert all(f["to"] is None and f["fetch"] == [] for f in off)


def test_strangers_cannot_hold_more_than_a_few_connections(tmp_path):
    async def scenario() -> tuple[list[bytes], bytes]:
        store = PeerStore(tier=tmp_path, secret=new_secret(), job_id="j", newest_gen=lambda: 1)
        port = await store.start()
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_UNAUTH)]
        nonces = [await asyncio.wait_for(r.readexactly(16), TIMEOUT_S) for r, _ in held]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        extra = await asyncio.wait_for(reader.read(16), TIMEOUT_S)  # closed at once: b""
        for _, w in [*held, (reader, writer)]:
            w.close()
        store.close()
        return nonces, extra

    nonces, extra = asyncio.run(scenario())
    assert len(set(nonces)) == MAX_UNAUTH and extra == b""


def test_a_push_cut_short_by_a_dead_host_does_not_hold_the_replica(managers, tmp_path):
    """The pusher's host loses power mid-snapshot (no FIN, no RST): when this host launches
    the next generation, the push is cut off, and a spare's fetch of that rank is answered."""
    _, mgr = trained(managers, tmp_path / "a", steps=1, width=512)
    source = files.rank_dir(tier(tmp_path / "a", managers.job), 0)
    [snap] = files.snapshots(source, 0)
    mgr.close(persist_last=False)
    secret, job = new_secret(), managers.job
    newest = 1

    async def scenario() -> dict:
        nonlocal newest
        store = PeerStore(tier=tier(tmp_path / "b", job), secret=secret, job_id=job,
                          newest_gen=lambda: newest)  # fmt: skip
        port = await store.start()
        pusher = await open_channel("127.0.0.1", port, secret, 5, server=Role.PEER)
        pusher.send("hello", role="peer", host="a", gen=1)
        pusher.send(
            "snapshot", rank=0, slot=snap.slot, step=snap.step, generation=snap.generation,
            manifest_size=len(snap.manifest), objects_size=0, data_size=snap.data_size,
        )  # fmt: skip
        pusher.send_blob(snap.manifest)
        pusher.send_blob(next(files.data_chunks(source, snap)))  # then silence: power is gone
        await pusher.drain(5)
        await until(lambda: store.pushers, "the push to be under way")
        newest = 2
        store.fence_older(2)  # what the agent does when it launches generation 2
        source_ = {"addr": "127.0.0.1", "port": port, "which": "replica", "ranks": [0]}
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        report = await fetch(source_, tier=tier(tmp_path / "s", job), gen=2, host="s",
                             secret=secret)  # fmt: skip
        report["waited_s"] = loop.time() - t0
        pusher.close()
        store.close()
        return report

    report = asyncio.run(scenario())
    assert "error" not in report and report["snapshots"] == [], report  # nothing whole to give
    assert report["waited_s"] < 5, report
