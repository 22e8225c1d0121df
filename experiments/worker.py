"""Entry point of one benchmark worker process: `python -m experiments.worker`.

Started by a system's launcher on a worker node. The run's parameters arrive as JSON in
PHUB_EXCHANGE (model, scale, compute, iterations, warmup, verify, worker_class, out_dir; image_size
and batch for real compute; monitor_clock, the runner's experiments.monitor clock file); the system reads its own environment (phub's PHUB_*, ps-lite's DMLC_*,
gloo's GLOO_*). With compute zero or replay the worker runs the replay (experiments.replay), with
real it trains the network (experiments.realcompute). The rank's result is written atomically to
OUT_DIR/rankR.json; a failure exits non-zero with the reason on stderr.
"""
from __future__ import annotations

import json
import os
import sys

from .fileio import write_json
from .models import load_model, scaled
from .replay import run
from .systems import worker_system

ENV_PARAMS = "PHUB_EXCHANGE"


def main() -> int:
    params = json.loads(os.environ[ENV_PARAMS])
    system = worker_system(params["worker_class"], params)
    if params["compute"] == "real":  # imports MXNet: only when this run trains a real network
        from .realcompute import run as train

        result = train(system, params)
    else:
        model = scaled(load_model(params["model"]), params.get("scale"))
        result = run(system, model, params["compute"], params["iterations"], params["warmup"], params["verify"],
                     optimize=params.get("variant") != "no_optimizer", monitor_clock=params.get("monitor_clock"))
    write_json(os.path.join(params["out_dir"], f"rank{result['rank']}.json"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
