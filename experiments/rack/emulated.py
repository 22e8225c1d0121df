"""An emulated rack on one machine: nodes are network namespaces, switches are bridges, links are
veth pairs shaped with htb. The local default for every experiment.

    with EmulatedRack("config/racks/2x2.yaml") as cluster:     # or emulated_cluster(spec)
        run_job(command, len(cluster.workers), config, cluster=cluster)

`up()` makes the namespaces of one run (`phub-<run id>-...`, see `topology`), measures every
link (`preflight`), and returns a `phub.launching.cluster.Cluster`: one PBox per rack (its K interfaces as
addresses), the workers in rank order, `hierarchical` when there is more than one rack, each node
running commands through `ip netns exec NS`. `extra` holds what results must record: configured
and measured rates, scale factors, the rack servers' fixed port. `down()` stops every process in
the run's namespaces and deletes them (the switch namespace takes its bridges and veths along).
The context manager always tears down: on errors, SIGINT and SIGTERM, which it turns into
KeyboardInterrupt while it is active (SIGINT too when the process inherited it ignored, as a
command started in the background by some shells does: Ctrl-C still removes the rack). A run whose process died (SIGKILL, power) is stale;
the next `up` and `python -m experiments rack down --all-stale` remove it (see `runstate`).

Needs CAP_NET_ADMIN (root). Without it, `reexec_unprivileged()` re-runs the current command in an
unprivileged user + network namespace when the system allows one; otherwise the error says what
is missing and how to run instead.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import signal
import sys
import threading
from typing import Any, Dict, Iterator, Mapping, Optional, Union

from phub.launching.cluster import Cluster, Node

from . import netns, preflight, rackbuild, runstate
from .netns import USERNS_ENV, RackError
from .rackspec import RackSpec, load_spec
from .topology import Plan, make_plan

SpecLike = Union[str, os.PathLike, Mapping[str, Any], RackSpec]
_TEARDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _log(message: str) -> None:
    print(f"rack: {message}", file=sys.stderr, flush=True)


class EmulatedRack:
    def __init__(self, spec: SpecLike, preflight: Optional[bool] = None, detached: bool = False,
                 overrides: Optional[Mapping[str, Any]] = None):
        """`preflight` overrides the spec's preflight.enabled; `detached`: the run outlives this
        process (not stale when it exits; `python -m experiments rack down` removes it); `overrides` replaces
        top-level keys of the spec (e.g. {"workers_per_rack": 8})."""
        self.spec = load_spec(spec, overrides)
        self.run_id = secrets.token_hex(3)
        self.plan: Plan = make_plan(self.spec, self.run_id)
        self.preflight = self.spec.preflight.enabled if preflight is None else preflight
        self.detached = detached
        self.links: list = []  # measured rows, one per shaped link
        self.cluster: Optional[Cluster] = None
        self._state: Optional[runstate.RunState] = None
        self._previous_handlers: dict = {}

    # -- life cycle --------------------------------------------------------------------------
    def up(self) -> Cluster:
        problem = netns.privilege_problem(in_user_namespace=bool(os.environ.get(USERNS_ENV)))
        if problem:
            raise RackError(problem)
        try:
            for report in runstate.clean_stale():
                _log(f"removed stale run {report['run_id']}: {len(report['namespaces'])} namespace(s), "
                     f"{len(report['processes'])} process(es)")
        except RackError as exc:  # someone else's leftovers do not stop this run
            _log(f"could not remove a stale run ({exc}); `python -m experiments rack down --all-stale` retries")
        source = self.spec.source if self.spec.source == "<dict>" else os.path.abspath(self.spec.source)
        self._state = runstate.new_state(self.run_id, self.plan.namespaces, self.detached, source)
        self._state.save()  # before the first namespace exists, so a crash from here on is cleanable
        try:
            rackbuild.build(self.plan)
            rackbuild.verify(self.plan)
            if self.preflight:
                self.links = preflight.measure(self.plan, self.spec.preflight)
            self.cluster = self._make_cluster()
            self._state.summary = self.summary()
            self._state.save()
        except BaseException:
            self.down()
            raise
        return self.cluster

    def down(self) -> dict:
        """Remove everything this run made (idempotent). A SIGINT or SIGTERM that arrives meanwhile
        waits until the rack is gone, then takes effect as usual."""
        if self._state is None:
            return {"namespaces": [], "processes": []}
        deferred: list = []
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in _TEARDOWN_SIGNALS:
                previous[sig] = signal.signal(sig, lambda signum, frame: deferred.append(signum))
        try:
            report = runstate.teardown(self.plan.namespaces, self._state)
            self._state = None
            self.cluster = None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if deferred:
            signal.raise_signal(deferred[0])
        return report

    def __enter__(self) -> Cluster:
        if threading.current_thread() is threading.main_thread():
            self._previous_handlers = {sig: signal.signal(sig, _raise_interrupt) for sig in _TEARDOWN_SIGNALS}
        try:
            return self.up()
        except BaseException:
            self._restore_handler()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            self._restore_handler()

    def _restore_handler(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers = {}

    # -- what the rack offers ----------------------------------------------------------------
    def _node(self, name: str, host, rack: int) -> Node:
        return Node(name, host.addresses, tuple(netns.exec_argv(host.ns)), rack=rack)

    def _make_cluster(self) -> Cluster:
        workers = tuple(self._node(f"w{g}", h, h.rack) for g, h in enumerate(self.plan.workers))
        servers = tuple(self._node(f"pbox{r}", p, r) for r, p in enumerate(self.plan.pboxes))
        return Cluster(servers, workers, hierarchical=self.spec.racks > 1, extra=self.extra())

    def sharded_cluster(self) -> Cluster:
        """The same rack with a server shard on every worker node instead of the PBoxes (PShard,
        and the sharded PS that the oversubscription experiment compares against)."""
        if self.cluster is None:
            raise RackError("the rack is not up")
        return dataclasses.replace(self.cluster, extra=self.extra()).sharded()

    def extra(self) -> Dict[str, Any]:
        """Facts every result row records: rates configured and measured, scale factors, port."""
        spec = self.spec
        kinds = ("host", "pbox_nic") + (("uplink",) if spec.racks > 1 else ())
        return {
            "network": "emulated",
            "run_id": self.run_id,
            "switch_ns": self.plan.switch_ns,  # where the uplinks' counters are (experiments.monitor)
            "port": spec.port,
            "racks": spec.racks,
            "workers_per_rack": spec.workers_per_rack,
            "pbox_interfaces": spec.pbox_interfaces,
            "link_gbps": spec.link_gbps,
            "paper_rates_gbps": {"host": spec.host_link_gbps, "pbox_nic": spec.pbox_nic_gbps,
                                 **({"uplink": spec.uplink_gbps} if spec.racks > 1 else {})},
            "oversubscription": spec.oversubscription,
            "queueing": spec.queueing,
            "tcp_congestion": netns.TCP_CONGESTION,
            "scale": {"network": spec.scale_network, "model": spec.scale_model, "time": spec.scale_time},
            "configured_mbit": {kind: round(spec.mbit(kind), 3) for kind in kinds},
            "measured_mbit": preflight.summarize(self.links),
            "preflight": self.preflight,
            "links": list(self.links),
            "spec": spec.source,
        }

    def summary(self) -> Dict[str, Any]:
        """What `python -m experiments rack up` and `status` print: the nodes and the link rates."""
        return {"run_id": self.run_id, "spec": self.spec.source,
                "workers": [{"name": f"w{g}", "ns": h.ns, "address": h.addresses[0], "rack": h.rack}
                            for g, h in enumerate(self.plan.workers)],
                "pboxes": [{"name": f"pbox{r}", "ns": p.ns, "addresses": list(p.addresses), "rack": r}
                           for r, p in enumerate(self.plan.pboxes)],
                "port": self.spec.port, "configured_mbit": self.extra()["configured_mbit"],
                "measured_mbit": preflight.summarize(self.links), "links": list(self.links)}


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def emulated_cluster(spec: SpecLike, preflight: Optional[bool] = None,
                     **overrides: Any) -> Iterator[Cluster]:
    """`with emulated_cluster("rack.yaml", workers_per_rack=4) as cluster:` a Cluster on a fresh
    emulated rack (spec keys given as keywords replace the file's), removed when the block ends,
    however it ends."""
    with EmulatedRack(spec, preflight, overrides=overrides) as cluster:
        yield cluster


def reexec_unprivileged(argv: Optional[list] = None) -> None:
    """If this process lacks CAP_NET_ADMIN, replace it with the same command (or `argv`) run
    inside an unprivileged user + network namespace, where it may build a rack; it returns only
    when nothing needs doing. Raises RackError when that namespace cannot be made either."""
    if netns.cap_net_admin() or os.environ.get(USERNS_ENV):
        return
    problem = netns.user_namespace_detail()
    if problem:
        raise RackError(netns.privilege_problem() or problem)
    argv = list(argv or getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    _log("no CAP_NET_ADMIN: re-running inside an unprivileged user namespace (the rack lives as long "
         "as this command)")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe("unshare", netns.reexec_argv(argv), dict(os.environ, **{USERNS_ENV: "1"}))
