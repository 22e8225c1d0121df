"""The paper's characterization numbers that this reproduction cannot measure (no GPUs of those
generations): paper only rows, one per claim the tables state."""
from __future__ import annotations

from typing import Dict, List

from ..reference import PAPER_MODEL, Table
from ..verdict import Claim

SECTION = "Characterization (paper only)"
MODEL_WORDS = {"alexnet": "AlexNet", "googlenet": "GoogleNet", "inception-v3": "Inception-v3",
               "resnet269": "ResNet-269"}


def context_claims(ref: Dict[str, Table]) -> List[Claim]:
    out = []
    for r in ref["sync_wait"].data.itertuples():
        model = PAPER_MODEL.get(r.model, r.model)
        out.append(Claim(SECTION, f"{MODEL_WORDS.get(model, model)} on {r.gpu}: GPU active {r.active_s:.2f} s of "
                         f"{r.total_s:.2f} s per iteration (share active)", float(r.active_s / r.total_s), None,
                         "paper_only", why="Needs the paper's cloud GPUs with 8 colocated PS: paper value only.",
                         note="Paper values chart-read."))
    gpus = ref["gpu_throughput"].data.set_index("gpu")["samples_per_s"]
    base = "GTX-1080Ti"
    for gpu, rate in gpus.items():
        text = f"ResNet-269 on {gpu}: {rate:g} samples/s"
        if gpu != base and base in gpus:
            text += f" ({rate / gpus[base]:.2f}x the {base}, the paper's GPU)"
        out.append(Claim(SECTION, text, float(rate), None, "paper_only", unit=" samples/s",
                         why="Needs that GPU: paper value only.", note="Paper value printed."))
    first, last = gpus.index[0], gpus.index[-1]
    out.append(Claim(SECTION, f"Faster GPUs emerge: {last} trains ResNet-269 {gpus[last] / gpus[first]:.0f}x "
                     f"faster than {first}", float(gpus[last] / gpus[first]), None, "paper_only", unit="x",
                     why="Needs those GPUs: paper value only."))
    return out
