"""One tidy CSV row per repeat of a point: the point's settings beside what the run measured.

Kept apart from the runner so the columns are defined once (analysis.results reads them).
"""
from __future__ import annotations

import platform
import subprocess

from experiments.monitor import FLOOR_COLUMNS
from experiments.runner import exchanges_per_s

COLUMNS = ["experiment", "point", "system", "model", "workers", "racks", "simulated_racks", "interfaces", "cores",
           "chunk_bytes", "chunk_bytes_paper", "chunks_per_worker", "bigarray_bound",
           "oversubscription", "network", "queueing", "setting",
           "link_gbps", "link_gbps_measured", "pbox_link_gbps", "uplink_gbps",
           "s_n", "s_m", "s_t", "compute", "variant", "job", "share", "repeat",
           "seconds_per_iteration", "exchanges_per_s", "samples_per_s", "bytes_per_worker", "verified",
           "verify_kind", "bound", "cpu_busy", "cpu_steal", "busiest_process", "busiest_process_cpu", "service_cpu",
           "link_utilization", "compute_floor_seconds", "wire_floor_seconds", "floor_seconds", "over_floor",
           "tcp_retransmits", "tcp_timeouts", "chunks_per_s_per_core", "shared_with", "measurement", "git_commit", "host"]


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except OSError:
        return ""


def chunks_per_worker(model: str, scale, chunk_bytes: int) -> int:
    """How many chunks one worker pushes per exchange of `model` as `scale` shrinks it."""
    from experiments import models

    return models.chunks_per_worker(models.scaled(models.load_model(model), scale), chunk_bytes)


def _host_rate(extra: dict, key: str) -> float:
    if key == "configured":
        return float(extra.get("configured_mbit", {}).get("host", 0))
    return float(extra.get("measured_mbit", {}).get("host", {}).get("mean_mbit", 0))


def _configured_gbps(extra: dict, kind: str):
    rate = extra.get("configured_mbit", {}).get(kind)
    return rate / 1000 if rate else ""


def tidy_row(point: dict, result: dict, commit: str, chunks: int, shared_with: str = "") -> dict:
    """The CSV row of one repeat: `result` is a runner row (experiments.runner); `chunks` the
    point's chunks_per_worker (the same for every repeat)."""
    extra = result.get("cluster", {}) or {}  # an emulated rack's facts; empty on loopback
    scale = extra.get("scale", {})
    bound = result.get("bound") or {}
    seconds = result["seconds_per_iteration"]
    rate = ""
    if point["experiment"] == "calibration" and bound.get("service_cpu"):
        # one server core's chunk rate: chunks it handled per second of its own CPU
        rate = round(point["workers"] * chunks / seconds / bound["service_cpu"], 1)
    verify_kind = result.get("verify_kind") or "none"
    return {
        "experiment": point["experiment"], "point": point["id"], "system": point["system"], "model": point["model"],
        "workers": result.get("workers", point["workers"]), "racks": point["racks"],
        # the racks one PBox stood in for (the paper's method); empty where the racks were real
        "simulated_racks": point.get("simulated_racks", ""), "interfaces": point["interfaces"],
        "cores": point["cores"], "chunk_bytes": point["chunk_bytes"], "chunk_bytes_paper": point["chunk_bytes_paper"],
        "chunks_per_worker": chunks, "bigarray_bound": _opt(result.get("bigarray_bound")),  # stock MXNet's, as run
        "oversubscription": point["oversubscription"],
        "network": point["network"], "queueing": extra.get("queueing", ""), "setting": point["setting"],
        "link_gbps": _host_rate(extra, "configured") / 1000 if extra else "",
        "link_gbps_measured": _host_rate(extra, "measured") / 1000 if extra else "",
        # the PBox's and the racks' uplinks' configured rates (the cross-rack scheme's wire bound)
        "pbox_link_gbps": _configured_gbps(extra, "pbox_nic"), "uplink_gbps": _configured_gbps(extra, "uplink"),
        "s_n": scale.get("network", 1), "s_m": scale.get("model", 1), "s_t": scale.get("time", 1),
        "compute": point["compute"], "variant": result.get("variant") or point["variant"], "job": result.get("job", ""),
        "share": result.get("share", ""), "repeat": result.get("repeat", 0),
        "seconds_per_iteration": seconds,
        "exchanges_per_s": exchanges_per_s(result.get("workers", point["workers"]), seconds),
        "samples_per_s": result.get("samples_per_s", ""), "bytes_per_worker": result["bytes_per_worker"],
        "verified": result.get("verified", False), "verify_kind": verify_kind,
        "bound": bound.get("bound", ""), "cpu_busy": _opt(bound.get("cpu_busy")),
        "cpu_steal": _opt(bound.get("cpu_steal")),
        "busiest_process": bound.get("busiest_process", ""),
        "busiest_process_cpu": _opt(bound.get("busiest_process_cpu")), "service_cpu": _opt(bound.get("service_cpu")),
        "link_utilization": _opt(bound.get("link_utilization")),
        **{k: _opt(bound.get(k)) for k in FLOOR_COLUMNS},
        "tcp_retransmits": _opt(bound.get("tcp_retransmits")),
        "tcp_timeouts": _opt(bound.get("tcp_timeouts")), "chunks_per_s_per_core": rate,
        "shared_with": shared_with, "measurement": point["measurement"], "git_commit": commit, "host": platform.node(),
    }


def _opt(value):
    return "" if value is None else value
