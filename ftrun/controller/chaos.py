"""Fault injection on request (`ftrun chaos`): route an action to the right agent, journal it.

A request comes from a `ftrun chaos` client over the authenticated control plane; the agent
carries it out (at a step, if asked) and reports back when it did, so the incident that follows
knows the exact fault time.

"At step N" is the job's step N. The target host's agent knows its own ranks' steps, and acts
on the exact step; a host whose ranks report none (the steps come from a line only rank 0
prints, on another host) would wait for ever. Such a request is held here, once another host
reports steps in the generation, and sent when the job's step reaches N (a step or so late: the
agents report progress every so often).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ftrun.controller.server import ControlServer
from ftrun.journal import Journal
from ftrun.wire.inbound import Chaos, Injected, Message, Progress

if TYPE_CHECKING:
    from ftrun.controller.generation import GenWatch

RANK_ACTIONS = ("kill-rank", "hang-rank")
HOST_ACTIONS = ("kill-agent", "freeze-agent")
ACTIONS = RANK_ACTIONS + HOST_ACTIONS


class ChaosDesk:
    def __init__(self, server: ControlServer, journal: Journal, *, nproc_per_node: int) -> None:
        self.server = server
        self.journal = journal
        self.nproc_per_node = nproc_per_node
        self.gen: int | None = None  # the generation `stepping` and `held` are of
        self.stepping: set[str] = set()  # its agents whose ranks have reported a step
        self.held: list[tuple[str, dict[str, Any]]] = []  # (target agent, inject) by at_step

    def handle(self, sender: str, msg: Message, watch: GenWatch | None) -> bool:
        """Take a chaos request or an agent's injection report; False for anything else
        (progress is looked at on its way to the generation's watch)."""
        match msg:
            case Progress():
                if watch is not None and msg.gen == watch.number and msg.step is not None:
                    self._progress(sender, int(msg.step), watch)
                return False
            case Chaos() if sender in self.server.clients:
                self._request(sender, msg, watch)
                return True
            case Injected():
                event = self.journal.record(
                    "fault_injected",
                    gen=msg.gen,
                    action=msg.action,
                    rank=msg.rank,
                    host=self.server.host_of(sender),  # its own, whatever it claims
                    injected_t=msg.t,
                )
                if watch is not None and msg.gen == watch.number:
                    watch.injected = {
                        "action": msg.action,
                        "rank": msg.rank,
                        "t": msg.t or event["t"],
                    }
                return True
        return False

    def _request(self, client: str, msg: Chaos, watch: GenWatch | None) -> None:
        action, rank, host = msg.action, msg.rank, msg.host
        error = None
        target = None
        if action not in ACTIONS:
            error = f"unknown action {action!r}; one of {', '.join(ACTIONS)}"
        elif watch is None:
            error = "no generation is running right now (starting or restarting); try again"
        elif action in RANK_ACTIONS:
            world = len(watch.order) * self.nproc_per_node
            if not isinstance(rank, int) or not 0 <= rank < world:
                error = f"{action} needs --rank in 0..{world - 1}"
            else:
                target = watch.order[rank // self.nproc_per_node]
        else:
            hosts = {h: a for a, h in watch.hosts.items()}
            if host is None and len(hosts) == 1:
                target = next(iter(hosts.values()))
            elif host in hosts:
                target = hosts[host]
            else:
                error = f"{action} needs --host, one of {', '.join(sorted(hosts))}"
        if error is not None or watch is None or target is None:
            self.server.send(client, "chaos_ack", ok=False, message=error)
            return
        at_step = msg.at_step
        self.journal.record(
            "chaos_requested",
            gen=watch.number,
            action=action,
            rank=rank,
            host=watch.hosts[target],
            at_step=at_step,
        )
        inject = {"gen": watch.number, "action": action, "rank": rank, "at_step": at_step}
        self._generation(watch)
        if at_step is not None and self.stepping and target not in self.stepping:
            self.held.append((target, inject))  # its ranks report no step: the job's will do
            self._release(watch.max_step or 0)
        else:
            self.server.send(target, "inject", **inject)
        when = f" at step {at_step}" if at_step is not None else ""
        who = f"rank {rank}" if action in RANK_ACTIONS else f"host {watch.hosts[target]}"
        self.server.send(
            client,
            "chaos_ack",
            ok=True,
            message=f"{action} on {who}{when} (generation {watch.number})",
        )

    def _generation(self, watch: GenWatch) -> None:
        if self.gen != watch.number:  # a new generation: the last one's requests died with it
            self.gen, self.stepping, self.held = watch.number, set(), []

    def _progress(self, agent: str, step: int, watch: GenWatch) -> None:
        self._generation(watch)
        self.stepping.add(agent)
        if self.held:
            self._release(max(step, watch.max_step or 0))

    def _release(self, job_step: int) -> None:
        for target, inject in [h for h in self.held if job_step >= h[1]["at_step"]]:
            self.held.remove((target, inject))
            self.server.send(target, "inject", **{**inject, "at_step": None})
