"""`python -m experiments rack up|down|status`: make, remove and list emulated racks.

    python -m experiments rack up --spec config/racks/2x2.yaml         # build + preflight, leave it up
    python -m experiments rack up --spec config/racks/2x2.yaml --hold  # ... remove it on Ctrl-C / SIGTERM
    python -m experiments rack status                                  # every run: owner, namespaces, rates
    python -m experiments rack down --spec config/racks/2x2.yaml       # the runs made from that spec
    python -m experiments rack down --run 3fa9c1 | --all-stale         # one run | every run whose creator died
"""
from __future__ import annotations

import json
import os
import signal
import sys


def add_parser(sub) -> None:
    """Register `rack` under the harness command's subparsers."""
    rack = sub.add_parser("rack", help="emulated racks: network namespaces joined by shaped links").add_subparsers(
        dest="rack", required=True)
    up = rack.add_parser("up", help="build a rack from a spec, measure its links, print its nodes")
    up.add_argument("--spec", required=True, help="rack spec (YAML or JSON), e.g. config/racks/2x2.yaml")
    up.add_argument("--hold", action="store_true", help="stay in the foreground; remove the rack on Ctrl-C/SIGTERM")
    up.add_argument("--no-preflight", action="store_true", help="skip measuring the links")
    up.add_argument("--json", action="store_true", help="print the rack's summary as JSON (last line)")
    up.set_defaults(func=cmd_up)

    down = rack.add_parser("down", help="remove racks: everything their runs made, processes included")
    which = down.add_mutually_exclusive_group(required=True)
    which.add_argument("--spec", help="the runs made from this spec file")
    which.add_argument("--run", help="the run with this id")
    which.add_argument("--all-stale", action="store_true",
                       help="every run whose creating process is gone, and namespaces left without a state file")
    down.set_defaults(func=cmd_down)

    status = rack.add_parser("status", help="list the runs on this machine")
    status.add_argument("--spec", help="only the runs made from this spec file")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=cmd_status)


def _print_summary(summary: dict, as_json: bool) -> None:
    out = sys.stderr if as_json else sys.stdout
    print(f"rack {summary['run_id']} ({summary['spec']}): rack servers listen on port {summary['port']}", file=out)
    for node in summary["pboxes"] + summary["workers"]:
        addresses = ", ".join(node.get("addresses") or [node["address"]])
        print(f"  {node['name']:>6}  rack {node['rack']}  {node['ns']:<22} {addresses}", file=out)
    measured = summary.get("measured_mbit") or {}
    for kind, rate in summary["configured_mbit"].items():
        got = measured.get(kind)
        seen = (f"measured {got['min_mbit']:.1f}..{got['max_mbit']:.1f}" if got else "not measured")
        print(f"  {kind:>8} links: {rate:.1f} Mbit/s configured, {seen}", file=out)
    if as_json:
        print(json.dumps(summary))


def cmd_up(args) -> int:
    from .emulated import EmulatedRack, reexec_unprivileged
    from .netns import USERNS_ENV

    reexec_unprivileged()  # returns at once with CAP_NET_ADMIN; else replaces this process, or raises
    hold = args.hold or bool(os.environ.get(USERNS_ENV))  # a user-namespace rack dies with its command
    rack = EmulatedRack(args.spec, preflight=False if args.no_preflight else None, detached=not hold)
    if not hold:
        rack.up()
        _print_summary(rack.summary(), args.json)
        print(f"run commands on a node with `ip netns exec NAMESPACE CMD`; remove the rack with "
              f"`python -m experiments rack down --run {rack.run_id}`", file=sys.stderr)
        return 0
    try:
        with rack:
            _print_summary(rack.summary(), args.json)
            print("holding the rack; Ctrl-C or SIGTERM removes it", file=sys.stderr, flush=True)
            while True:
                signal.pause()  # until a signal: the context manager turns SIGTERM into KeyboardInterrupt
    except KeyboardInterrupt:
        print(f"rack: removed run {rack.run_id}", file=sys.stderr)
        return 0


def _matching(spec):
    from .runstate import load_runs

    runs = load_runs()
    if spec is None:
        return runs
    path = os.path.abspath(spec)
    return [r for r in runs if r.spec_source == path]


def cmd_down(args) -> int:
    from .netns import RackError
    from .runstate import clean_stale, teardown

    if args.all_stale:
        reports = clean_stale()
    else:
        runs = _matching(args.spec) if args.spec else [r for r in _matching(None) if r.run_id == args.run]
        if not runs and args.spec and not os.path.isfile(args.spec):
            from phub.errors import ConfigError

            raise ConfigError(f"rack spec {args.spec}: no such file (and no run was made from it)")
        if not runs:
            print(f"rack: no run of {'spec ' + args.spec if args.spec else 'id ' + args.run}", file=sys.stderr)
            return 1 if args.run else 0
        reports = []
        for run in runs:
            if not run.detached and run.creator_alive():
                raise RackError(f"run {run.run_id} belongs to process {run.pid}, which is still running; "
                                "stop that process (it removes its rack) or wait for it")
            reports.append(dict(run_id=run.run_id, **teardown(run.namespaces, run)))
    for report in reports:
        print(f"rack: removed run {report['run_id']}: {len(report['namespaces'])} namespace(s), "
              f"stopped {len(report['processes'])} process(es)")
    if not reports:
        print("rack: nothing to remove")
    return 0


def cmd_status(args) -> int:
    from .netns import list_namespaces, namespace_pids
    from .runstate import load_runs, orphan_namespaces

    present = set(list_namespaces())
    rows = []
    for run in _matching(args.spec):
        owner = ("detached" if run.detached else f"held by pid {run.pid}" if run.creator_alive()
                 else f"stale (creator pid {run.pid} is gone)")
        here = [ns for ns in run.namespaces if ns in present]
        rows.append({"run_id": run.run_id, "spec": run.spec_source, "owner": owner, "stale": run.stale,
                     "namespaces": len(here), "of": len(run.namespaces),
                     "processes": sum(len(namespace_pids(ns)) for ns in here),
                     "configured_mbit": run.summary.get("configured_mbit", {}),
                     "measured_mbit": run.summary.get("measured_mbit", {})})
    orphans = orphan_namespaces(load_runs())
    if args.json:
        print(json.dumps({"runs": rows, "orphan_namespaces": orphans}))
        return 0
    if not rows:
        print("no emulated racks")
    for row in rows:
        rates = ", ".join(f"{k} {v:g}" for k, v in row["configured_mbit"].items())
        print(f"{row['run_id']}  {row['owner']}  {row['namespaces']}/{row['of']} namespaces, "
              f"{row['processes']} process(es)  {row['spec']}  [{rates or 'building'} Mbit/s]")
    if orphans:
        print(f"namespaces without a state file (removed by `python -m experiments rack down --all-stale`): {', '.join(orphans)}")
    return 0
