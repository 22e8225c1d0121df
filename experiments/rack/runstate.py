"""What each emulated-rack run made, kept on disk so that `down` can remove it even after a crash.

One small JSON file per run, `<state dir>/<run id>.json` (default state dir /run/phub/racks, or
$PHUB_RACK_STATE_DIR), written *before* the first namespace is created and removed after the last
one is deleted. It names every namespace of the run (deleting the switch namespace removes its
bridges and every veth pair), the creator's pid and that process's start time (so a reused pid is
not mistaken for the creator). A run is *stale* when its creator is gone, unless it was made to
outlive its creator (`python -m experiments rack up` without --hold: a detached run, removed by `python -m experiments rack down`).
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import List, Optional

from . import netns
from .topology import NAME_PREFIX

STATE_ENV = "PHUB_RACK_STATE_DIR"
RUN_ID = re.compile(r"^[0-9a-f]{6}$")
NS_NAME = re.compile(rf"^{NAME_PREFIX}([0-9a-f]{{6}})-[a-z0-9]+$")


def state_dir() -> str:
    return os.environ.get(STATE_ENV) or "/run/phub/racks"


def process_start(pid: int) -> Optional[int]:
    """The start time of process `pid` in clock ticks since boot (None if there is no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name in () may hold spaces


@dataclass
class RunState:
    run_id: str
    namespaces: List[str]
    pid: int
    pid_start: Optional[int]
    detached: bool = False
    spec_source: str = ""
    created: float = field(default_factory=time.time)
    summary: dict = field(default_factory=dict)  # rates and nodes, for `python -m experiments rack status`

    @property
    def path(self) -> str:
        return os.path.join(state_dir(), f"{self.run_id}.json")

    def creator_alive(self) -> bool:
        return self.pid_start is not None and process_start(self.pid) == self.pid_start

    @property
    def stale(self) -> bool:
        return not self.detached and not self.creator_alive()

    def save(self) -> None:
        os.makedirs(state_dir(), exist_ok=True)
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(asdict(self), f, indent=1)
        os.replace(tmp, self.path)


def new_state(run_id: str, namespaces: List[str], detached: bool, spec_source: str) -> RunState:
    pid = os.getpid()
    return RunState(run_id, list(namespaces), pid, process_start(pid), detached, spec_source)


def load_runs() -> List[RunState]:
    runs = []
    try:
        names = sorted(os.listdir(state_dir()))
    except FileNotFoundError:
        return []
    for name in names:
        if not (name.endswith(".json") and RUN_ID.match(name[:-5])):
            continue
        try:
            with open(os.path.join(state_dir(), name)) as f:
                runs.append(RunState(**json.load(f)))
        except (OSError, ValueError, TypeError):
            continue  # being written by its creator, or not ours
    return runs


def orphan_namespaces(runs: List[RunState]) -> List[str]:
    """Namespaces named like a run's whose run has no state file (e.g. the file was deleted)."""
    known = {r.run_id for r in runs}
    return [ns for ns in netns.list_namespaces()
            if (m := NS_NAME.match(ns)) and m.group(1) not in known]


def teardown(namespaces: List[str], state: Optional[RunState] = None) -> dict:
    """Stop every process in the namespaces, delete them, then the run's state file.

    Tries every namespace even if one fails; raises RackError listing the failures at the end.
    Returns {"namespaces": deleted, "processes": pids stopped}.
    """
    existing = set(netns.list_namespaces())
    deleted, stopped, failures = [], [], []
    for ns in namespaces:
        if ns not in existing:
            continue
        try:
            stopped += netns.delete_namespace(ns)
            deleted.append(ns)
        except netns.RackError as exc:
            failures.append(str(exc))
    if failures:
        raise netns.RackError("could not remove all of the rack: " + "; ".join(failures))
    if state is not None:
        try:
            os.remove(state.path)
        except FileNotFoundError:
            pass
    return {"namespaces": deleted, "processes": stopped}


def clean_stale() -> List[dict]:
    """Remove every stale run and orphaned namespace; one report per run removed."""
    reports = []
    runs = load_runs()
    for run in runs:
        if run.stale:
            reports.append(dict(run_id=run.run_id, **teardown(run.namespaces, run)))
    orphans = orphan_namespaces(runs)
    if orphans:
        reports.append(dict(run_id="(no state file)", **teardown(orphans)))
    return reports
