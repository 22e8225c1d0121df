"""The experiment grid: config -> the list of points to measure, each a dict with an `id`.

Pure and deterministic, so Snakemake, the progress report and the tests all see the same list.
A point holds everything `run_point.py` needs to run it: the `phub bench exchange` options and,
on an emulated network, the rack spec (rates at the paper's scale; the rack divides them by s_n).
"""
from __future__ import annotations

from typing import Dict, Iterator, List

SETTINGS_GBPS = {"cloud10g": 10, "ib56g": 56}
DEFAULT_MAX_LINK_MBIT = 250.0  # fastest emulated link (config: rack.max_link_mbit)


def _rack(config: dict, racks: int, workers_per_rack: int, interfaces: int, gbps: float,
          oversubscription: float = 1.0) -> dict:
    rack = {"racks": racks, "workers_per_rack": workers_per_rack, "pbox_interfaces": interfaces,
            "link_gbps": gbps, "oversubscription": oversubscription}
    settings = dict(config.get("rack", {}))  # scale factors, preflight, port
    limit = settings.pop("max_link_mbit", DEFAULT_MAX_LINK_MBIT)
    scale = dict(settings.pop("scale", {}))
    # A faster paper setting is slowed down more, so that no emulated link needs more CPU than
    # this machine has; s_m stays, so compute is stretched more and comm:compute is kept.
    scale["network"] = max(scale.get("network", 1), gbps * 1000 / limit)
    rack.update(settings, scale=scale)
    return rack


def _point(config: dict, experiment: str, id_: str, **fields) -> dict:
    point = {"experiment": experiment, "id": id_, "repeats": config["repeats"], "verify": config.get("verify", True),
             "iterations": config["iterations"], "warmup": config["warmup"], "compute": "replay",
             "network": config["network"], "racks": 1, "interfaces": 1, "cores": config.get("server_cores", 1),
             "chunk_bytes": 32768, "oversubscription": 1, "setting": "", "variant": ""}
    if config["network"] == "hostfile":
        point["hostfile"] = config["hostfile"]
    point.update(fields)
    return point


def _pbox(config: dict, exp: dict) -> Iterator[dict]:
    for setting in exp["settings"]:
        for model in exp["models"]:
            for system in exp["systems"]:
                yield _point(config, "pbox", f"{setting}-{model}-{system}", system=system, model=model,
                             workers=exp["workers"], setting=setting, interfaces=exp["interfaces"],
                             rack=_rack(config, 1, exp["workers"], exp["interfaces"], SETTINGS_GBPS[setting]))


def _capacity(config: dict, exp: dict) -> Iterator[dict]:
    for interfaces in exp["interfaces"]:
        for workers in exp["workers"]:
            yield _point(config, "capacity", f"k{interfaces}-n{workers}", system="phub", model=exp["model"],
                         workers=workers, interfaces=interfaces, compute="zero",
                         rack=_rack(config, 1, workers, interfaces, exp["link_gbps"]))


def _scaling(config: dict, exp: dict) -> Iterator[dict]:
    for system in exp["systems"]:
        for workers in exp["workers"]:
            if system == "gloo-ring" and workers == 1:
                continue  # an allreduce over one rank exchanges nothing (the paper's chart starts gloo at 2)
            yield _point(config, "scaling", f"{system}-n{workers}", system=system, model=exp["model"],
                         workers=workers, compute="zero", interfaces=exp["interfaces"],
                         rack=_rack(config, 1, workers, exp["interfaces"], exp["link_gbps"]))


def _cross_rack(config: dict, exp: dict) -> Iterator[dict]:
    for model in exp["models"]:
        for racks in exp["racks"]:
            workers = racks * exp["workers_per_rack"]
            yield _point(config, "cross_rack", f"{model}-r{racks}", system="phub", model=model, workers=workers,
                         racks=racks, interfaces=exp["interfaces"],
                         rack=_rack(config, racks, exp["workers_per_rack"], exp["interfaces"], exp["link_gbps"]))


def _oversubscription(config: dict, exp: dict) -> Iterator[dict]:
    racks, per_rack = exp["racks"], exp["workers_per_rack"]
    for ratio in exp["ratios"]:
        for system in exp["systems"]:
            yield _point(config, "oversubscription", f"{system}-o{ratio:g}", system=system, model=exp["model"],
                         workers=racks * per_rack, racks=racks, oversubscription=ratio, interfaces=exp["interfaces"],
                         rack=_rack(config, racks, per_rack, exp["interfaces"], exp["link_gbps"], ratio))


def _breakdown(config: dict, exp: dict) -> Iterator[dict]:
    for model in exp["models"]:
        for system in exp["systems"]:
            for variant in exp["variants"]:
                yield _point(config, "breakdown", f"{model}-{system}-{variant}", system=system, model=model,
                             workers=exp["workers"], variant=variant,
                             compute="zero" if variant == "no_compute" else "replay",
                             rack=_rack(config, 1, exp["workers"], 1, exp["link_gbps"]))


def _chunk_sweep(config: dict, exp: dict) -> Iterator[dict]:
    for kb in exp["chunk_kb"]:
        yield _point(config, "chunk_sweep", f"c{kb}k", system="phub", model=exp["model"], workers=exp["workers"],
                     chunk_bytes=int(kb * 1024), interfaces=exp["interfaces"],
                     rack=_rack(config, 1, exp["workers"], exp["interfaces"], exp["link_gbps"]))


GENERATORS = {"pbox": _pbox, "capacity": _capacity, "scaling": _scaling, "cross_rack": _cross_rack,
              "oversubscription": _oversubscription, "breakdown": _breakdown, "chunk_sweep": _chunk_sweep}


def points(config: dict) -> List[dict]:
    """Every point of every enabled experiment, in a stable order; ids are unique per experiment."""
    result: List[dict] = []
    for name, generate in GENERATORS.items():
        exp = config["experiments"].get(name)
        if exp and exp.get("enabled", True):
            result.extend(generate(config, exp))
    return result


def by_key(config: dict) -> Dict[str, dict]:
    """Points keyed by "experiment/id" (the wildcard path the workflow uses)."""
    return {f"{p['experiment']}/{p['id']}": p for p in points(config)}
