"""The link check (`ftrun launch --link-check`): every ready host's agent runs a short gloo
probe with a peer in each of two rounds (link_judge.py's schedule and verdict, agent/link_probe.py
and agent/linkprobe.py the probe); a host slow with each of its peers is left out of every plan
(the job machine's `leave_out`), with one line saying why and what to do; a slow link between two
hosts otherwise fine is said. Every figure is journaled (`link_check`, with the hosts probed and
those joining).

When: once for every host before the first generation (`before_first`), and between generations
for the hosts that would join (`before_join`): a host the next plan would take whose agent no
check has seen (a spare ready after the first check, a host added with `ftrun hosts JOB add`, a
lost host back with a new agent) is probed with up to two checked peers, by the same schedule
and verdict, before it enters the plan: a bad one is left out with the same line, a good one
joins. The agents that ran the last generation count as checked, so a restart on the same hosts
probes nothing: the check's seconds (most of them each probe importing torch) would be added to
every restart in place, whose target is a fraction of torchrun's. A joiner with a single checked
peer makes one pair, which judges nothing (link_judge.py): it joins unprobed, and that is said.
The running generation is not probed (its ranks use the links): a grow toward a host that then
proves bad costs the restart the grow began, once, since that host is left out.

Opt-in: a default is a promise, and on a loaded machine a check that could leave a good host out
has yet to prove it never does. Only where agents run on other hosts: on this machine alone
there is no link.

The pair's store is held by its first host, on the port that host's hello (or its last stop)
offered for the next rendezvous (so no port is guessed, and none is waited for); each agent's
report offers a fresh one in its place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ftrun.config import LaunchConfig
from ftrun.controller.fleet import Fleet
from ftrun.controller.inbox import Inbox
from ftrun.controller.link_judge import LinkVerdict, PairResult, judge, schedule
from ftrun.controller.reporting import Reporter
from ftrun.controller.roster import HostState, NotEnoughHosts
from ftrun.journal import Journal
from ftrun.wire.inbound import AgentLost, PreemptNotice, StopRequested
from ftrun.wire.inbound_checks import LinkProbed

# The probe's own time limit, for a probe that is stuck, not a slow one: idle, a 4-host check
# takes about 6 s (a torch import of ~1 s of CPU per host, then rounds of well under a second);
# in a loaded CI run on 2 cores the four imports alone took over 8 s, and a probe killed while
# it works makes the whole check say nothing.
PROBE_TIMEOUT_S = 30.0
# How much longer the controller waits for the reports: the agent kills a stuck probe a second
# past its limit (agent/link_probe.py) and then reports.
REPORT_MARGIN_S = 2.0


class LinkCheck:
    def __init__(
        self,
        config: LaunchConfig,
        *,
        fleet: Fleet,
        inbox: Inbox,
        journal: Journal,
        reporter: Reporter,
        excluded: Callable[[], Callable[[str], bool]],
        leave_out: Callable[[str, str], None],
    ) -> None:
        self.config, self.fleet, self.inbox = config, fleet, inbox
        self.journal, self.reporter = journal, reporter
        self.excluded, self.leave_out = excluded, leave_out
        self.count = 0
        self.checked: set[str] = set()  # agents a check saw and did not leave out (or that ran)

    async def before_first(self) -> bool:
        """Run the check if the job asked for it; False when a stop or a preemption notice came
        meanwhile (the caller ends the job as it would between generations)."""
        if not self.config.link_check:
            return True
        if not self.config.remote:
            self.reporter.notice("--link-check: this job runs on this machine only: no link")
            return True
        out = self.excluded()
        hosts = [h for h in self.fleet.roster.in_state(HostState.READY) if not out(h)]
        if len(hosts) < 2:
            self.reporter.notice(f"--link-check: {len(hosts)} host ready: no link to check")
        elif not await self.run(hosts):
            return False
        self._checked(hosts)
        return True

    async def before_join(self, ran: Iterable[str]) -> bool:
        """Between generations, before the next plan: probe the hosts it would take that no
        check has seen (the agents in `ran`, the last generation's, count as seen); each pass
        leaves out or lets in every one, and a host ready meanwhile gets the next pass. False
        when a stop or a preemption notice came meanwhile."""
        if not (self.config.link_check and self.config.remote):
            return True
        self.checked.update(ran)
        for _ in range(len(self.fleet.roster.slots)):
            joining, peers, planned = self._joining()
            if not joining:
                return True
            ring = _ring(peers[:2], joining)
            if len(ring) < 3:
                self.reporter.notice(
                    f"link check: {', '.join(joining)} joins unprobed: with {len(peers)} checked "
                    "host(s) to pair with, one pair cannot say which end of a slow link is at fault"
                )
            elif not await self.run(ring, joining=joining, planned=planned):
                return False
            self._checked(ring)
        return True

    def _joining(self) -> tuple[list[str], list[str], int]:
        """The hosts the next plan would take that no check has seen; the checked ones to pair
        them with (the plan's first, then other ready ones); how many the plan takes."""
        roster, out = self.fleet.roster, self.excluded()
        try:
            planned = roster.preview(out)
        except NotEnoughHosts:
            return [], [], 0  # the plan fails as it would have: nobody to probe

        def seen(host: str) -> bool:
            return self.fleet.agent_of(host) in self.checked

        usable = roster.in_state(HostState.READY, HostState.ACTIVE)
        peers = [h for h in dict.fromkeys([*planned, *usable]) if seen(h) and not out(h)]
        return [h for h in planned if not seen(h)], peers, len(planned)

    def _checked(self, hosts: list[str]) -> None:
        """The agents of `hosts` the check did not leave out: not probed again."""
        out = self.excluded()
        for host in hosts:
            if not out(host) and (agent := self.fleet.agent_of(host)) is not None:
                self.checked.add(agent)

    async def run(
        self, hosts: list[str], *, joining: list[str] | None = None, planned: int | None = None
    ) -> bool:
        """Probe `hosts` (in a ring: link_judge.schedule) and act on the verdict. `joining`: the
        hosts a check between generations is for; `planned`: how many the next plan takes."""
        self.count += 1
        began = time.monotonic()
        rounds = schedule(hosts)
        agents = {h: self.fleet.agent_of(h) or "" for h in hosts}
        rdzv = self.fleet.rendezvous
        orders: dict[str, list[tuple[int, str, str, int, int]]] = {h: [] for h in hosts}
        missing: dict[tuple[str, str], str] = {}
        for number, pairs in enumerate(rounds, 1):
            for a, b in pairs:
                port = rdzv.ports.pop(agents[a], None)
                if port is None:
                    missing[(a, b)] = f"{a}'s agent offered no port"
                    continue
                addr = rdzv.addrs.get(agents[a], a)
                orders[a].append((number, b, addr, port, 0))
                orders[b].append((number, a, addr, port, 1))
        for host, slots in orders.items():
            if slots:
                self.fleet.server.send(
                    agents[host],
                    "link_check",
                    check=self.count,
                    timeout_s=PROBE_TIMEOUT_S,
                    rounds=[s[0] for s in slots],
                    peers=[s[1] for s in slots],
                    addrs=[s[2] for s in slots],
                    ports=[s[3] for s in slots],
                    ranks=[s[4] for s in slots],
                )
        reports = await self._reports({agents[h]: h for h, s in orders.items() if s})
        if reports is None:
            return False
        results = [
            _pair(number, (a, b), reports, missing.get((a, b)))
            for number, pairs in enumerate(rounds, 1)
            for a, b in pairs
        ]
        verdict = judge(hosts, results)
        self._record(hosts, joining or [], results, verdict, time.monotonic() - began)
        self._act(hosts, joining or [], planned or len(hosts), verdict, time.monotonic() - began)
        return True

    async def _reports(self, waiting: dict[str, str]) -> dict[str, LinkProbed] | None:
        """Each agent's report (host → it), those that came by the deadline; None on a stop."""
        deadline = time.monotonic() + PROBE_TIMEOUT_S + REPORT_MARGIN_S
        got: dict[str, LinkProbed] = {}
        while waiting and (item := await self.inbox.next(deadline)) is not None:
            sender, msg = item
            if isinstance(msg, (StopRequested, PreemptNotice)):
                return None
            if isinstance(msg, LinkProbed) and sender in waiting and msg.check == self.count:
                got[waiting.pop(sender)] = msg
                if msg.port is not None:  # the one the check used, replaced
                    self.fleet.rendezvous.heard(sender, {"port": msg.port})
            elif isinstance(msg, AgentLost) and sender in waiting:
                waiting.pop(sender)
                self.fleet.on_lost(sender)
            else:
                self.inbox.side_channel(sender, msg, None)
        return got

    def _record(
        self,
        hosts: list[str],
        joining: list[str],
        results: list[PairResult],
        verdict: LinkVerdict,
        took: float,
    ) -> None:
        self.journal.record(
            "link_check",
            check=self.count,
            hosts=hosts,
            joining=joining,  # between generations: the hosts it was for (the rest: peers)
            seconds=round(took, 3),
            typical_latency_s=verdict.typical_latency_s,
            typical_bandwidth_Bps=verdict.typical_bandwidth_Bps,
            pairs=[
                {
                    "round": r.round,
                    "hosts": list(r.hosts),
                    "latency_s": r.latency_s,
                    "bandwidth_Bps": r.bandwidth_Bps,
                    "error": r.error,
                    "slow": verdict.slow.get(r.hosts),
                }
                for r in results
            ],
            bad_hosts=verdict.bad_hosts,
            bad_links=[{"hosts": list(p), "why": why} for p, why in verdict.bad_links.items()],
            note=verdict.note,
        )

    def _act(
        self, hosts: list[str], joining: list[str], left: int, verdict: LinkVerdict, took: float
    ) -> None:
        """Leave the bad hosts out (not below --min-nodes of the `left` a plan takes); say it."""
        for host, why in verdict.bad_hosts.items():
            if left - 1 < self.config.min_nodes:
                self.reporter.notice(
                    f"link check: {why}; kept: without it the job has fewer hosts than "
                    f"--min-nodes {self.config.min_nodes}",
                    level="warning",
                )
                continue
            left -= 1
            self.leave_out(host, f"link check: {why}")
            self.reporter.notice(
                f"link check: {why}: left out of this job. Check its network (NIC speed, "
                "cable, switch port, `tc qdisc show`), then run the job again",
                level="warning",
            )
        for (a, b), why in verdict.bad_links.items():
            self.reporter.notice(
                f"link check: the link between {a} and {b} is slow ({why}) while each is fine "
                "with its other peer; nobody left out for it (the figures cannot say which end "
                "is at fault)",
                level="warning",
            )
        if verdict.note is not None:
            self.reporter.notice(f"link check: {verdict.note}")
        elif not verdict.slow:
            lat, bw = verdict.typical_latency_s, verdict.typical_bandwidth_Bps
            figures = (
                f" (latency {lat * 1e3:.3g} ms, bandwidth {bw / 1e6:.3g} MB/s)"
                if lat is not None and bw is not None
                else ""
            )
            what = f"{', '.join(joining)} joining, " if joining else ""
            self.reporter.notice(
                f"link check: {what}{len(hosts)} hosts in {took:.1f} s: every link is fine{figures}"
            )


def _pair(
    number: int, hosts: tuple[str, str], reports: dict[str, LinkProbed], missing: str | None
) -> PairResult:
    """A pair's figures from the report of its store's host, else its peer's; else why none."""
    if missing is not None:
        return PairResult(round=number, hosts=hosts, error=missing)
    errors = []
    for me, peer in (hosts, hosts[::-1]):
        report = reports.get(me)
        if report is None:
            errors.append(f"no report from {me}")
            continue
        for i, (r, p) in enumerate(zip(report.rounds, report.peers, strict=False)):
            if r != number or p != peer:
                continue
            latency, bandwidth = report.latency_s[i], report.bandwidth_Bps[i]
            if latency is not None and bandwidth is not None:
                return PairResult(
                    round=number, hosts=hosts, latency_s=latency, bandwidth_Bps=bandwidth
                )
            errors.append(f"{me}: {report.errors[i] or 'no figures'}")
    return PairResult(round=number, hosts=hosts, error="; ".join(errors)[:500])


def _ring(peers: list[str], joining: list[str]) -> list[str]:
    """The probe's ring: joiners between checked peers (P1 J1 P2 J2 J3 ...), so that a lone
    joiner meets both peers, and the peers' own pair gives the typical figures."""
    ring: list[str] = []
    for i, host in enumerate(joining):
        ring += [peers[i], host] if i < len(peers) else [host]
    return ring + peers[len(joining) :]
