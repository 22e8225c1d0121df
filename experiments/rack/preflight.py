"""Preflight: measure every shaped link of an emulated rack, in both directions, before use.

Each measurement is one bounded bulk TCP transfer (`linkprobe.py`) between the two points that have
only that link between them (a node and its switch's probe; for an uplink, the rack's probe and the
core's). A transfer leaves from the sender's own address, so on a PBox it uses that NIC. Transfers
of different links run at the same time, in rounds whose configured rates add up to at most
`budget_mbit`, so that the link, not the CPU, limits each transfer; the two directions of a link
are measured in different rounds (the ACKs of one would slow the other). A round with a link off by
more than the tolerance runs once more, with the same transfers (two NICs that share a path must
still be caught), before the link counts as a failure: the machine is shared, and one slow round is
not a broken link.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Tuple

from .netns import RackError, exec_argv
from .rackspec import Preflight
from .topology import Link, Plan

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "linkprobe.py")
BASE_PORT = 20000
KINDS = ("host", "pbox_nic", "uplink")
KIND_WORDS = {"host": "host link", "pbox_nic": "PBox NIC link", "uplink": "uplink"}


@dataclass(frozen=True)
class Transfer:
    link: Link
    direction: str  # up or down
    sender: Tuple[str, str]  # (namespace, address)
    receiver: Tuple[str, str]


def transfers(plan: Plan) -> List[Transfer]:
    out = []
    for link in plan.shaped_links():
        below, above = plan.endpoints(link)
        out += [Transfer(link, "up", below, above), Transfer(link, "down", above, below)]
    return out


def rounds(items: List[Transfer], budget_mbit: float) -> List[List[Transfer]]:
    """First-fit decreasing: a round's configured rates add up to <= budget, one direction per link."""
    packed: List[List[Transfer]] = []
    for item in sorted(items, key=lambda t: -t.link.rate_mbit):
        for group in packed:
            load = sum(t.link.rate_mbit for t in group)
            if load + item.link.rate_mbit <= budget_mbit and all(t.link != item.link for t in group):
                group.append(item)
                break
        else:
            packed.append([item])
    return packed


def _python() -> List[str]:
    return [sys.executable, "-I", "-S", PROBE]  # the probe needs the standard library only


def _await_line(proc: subprocess.Popen, deadline: float, what: str) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise RackError(f"preflight: {what} failed: no answer within the time allowed")
    line = proc.stdout.readline()
    if line:
        return line
    try:  # end of output without a line: the process failed; say why
        proc.wait(max(0.1, deadline - time.monotonic()))
        err = proc.stderr.read().strip()
    except subprocess.TimeoutExpired:
        err = ""
    raise RackError(f"preflight: {what} failed (status {proc.poll()}): {err or 'no output'}")


def run_round(group: List[Transfer], cfg: Preflight) -> List[float]:
    """Run the transfers of one round at once; each one's measured wire rate in Mbit/s."""
    started: List[subprocess.Popen] = []
    try:
        receivers = []
        for i, t in enumerate(group):
            ns, address = t.receiver
            argv = exec_argv(ns) + _python() + ["recv", address, str(BASE_PORT + i), str(cfg.seconds + 3.0)]
            receivers.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            started.append(receivers[-1])
        deadline = time.monotonic() + 10.0
        for t, rx in zip(group, receivers):
            _await_line(rx, deadline, f"the receiver for {t.link.name} ({t.direction})")
        senders = []
        for i, t in enumerate(group):
            rate_bytes = t.link.rate_mbit * 1e6 / 8
            max_bytes = int(rate_bytes * cfg.seconds * 2) + (1 << 20)  # a broken shaper still stops early
            sndbuf = max(1 << 17, int(rate_bytes * 0.02))
            argv = exec_argv(t.sender[0]) + _python() + [
                "send", t.sender[1], t.receiver[1], str(BASE_PORT + i), str(cfg.seconds), str(max_bytes), str(sndbuf)]
            senders.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            started.append(senders[-1])
        deadline = time.monotonic() + cfg.seconds + 10.0
        rates = []
        for t, rx, tx in zip(group, receivers, senders):
            what = f"the transfer over {t.link.name} ({t.direction})"
            result = json.loads(_await_line(rx, deadline, what))
            try:
                code = tx.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RackError(f"preflight: {what}: the sender did not finish in time") from None
            if code != 0:
                raise RackError(f"preflight: {what}: the sender failed: {tx.stderr.read().strip()}")
            rates.append(result["wire_mbit"])
        return rates
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()


def measure(plan: Plan, cfg: Preflight) -> List[dict]:
    """Measure every shaped link both ways. One row per link; raises RackError naming every link
    that stays off by more than the tolerance."""
    def off(t: Transfer) -> float:
        return measured[t.link.name, t.direction] / t.link.rate_mbit - 1.0

    measured: Dict[Tuple[str, str], float] = {}
    groups = rounds(transfers(plan), cfg.budget_mbit)
    for group in groups:
        for t, rate in zip(group, run_round(group, cfg)):
            measured[t.link.name, t.direction] = rate
    first: Dict[Tuple[str, str], float] = {}
    for group in groups:  # a round with a link off runs once more, with the same company
        if any(abs(off(t)) > cfg.tolerance for t in group):
            for t, rate in zip(group, run_round(group, cfg)):
                if abs(off(t)) > cfg.tolerance:
                    first[t.link.name, t.direction] = measured[t.link.name, t.direction]
                    measured[t.link.name, t.direction] = rate
    failures = [f"{KIND_WORDS[t.link.kind]} {t.link.name} ({t.direction}): measured "
                f"{measured[t.link.name, t.direction]:.1f} Mbit/s (first try {first[t.link.name, t.direction]:.1f}), "
                f"configured {t.link.rate_mbit:.1f} Mbit/s ({off(t):+.1%}, allowed ±{cfg.tolerance:.0%})"
                for t in transfers(plan) if abs(off(t)) > cfg.tolerance]
    if failures:
        raise RackError("preflight: link rates are off: " + "; ".join(failures) +
                        ". Is the machine busy? Lower the rates (raise scale.network) or retry")
    return [{"link": link.name, "kind": link.kind, "rack": link.rack, "configured_mbit": link.rate_mbit,
             "up_mbit": round(measured[link.name, "up"], 2), "down_mbit": round(measured[link.name, "down"], 2)}
            for link in plan.shaped_links()]


def summarize(rows: List[dict]) -> Dict[str, dict]:
    """Per link kind: configured rate and the min / mean / max measured over links and directions."""
    out = {}
    for kind in KINDS:
        values = [r[d] for r in rows if r["kind"] == kind for d in ("up_mbit", "down_mbit")]
        if values:
            configured = next(r["configured_mbit"] for r in rows if r["kind"] == kind)
            out[kind] = {"configured_mbit": configured, "min_mbit": min(values), "max_mbit": max(values),
                         "mean_mbit": round(sum(values) / len(values), 2)}
    return out
