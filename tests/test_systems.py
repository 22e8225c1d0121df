"""Every system under test (phub and its real baselines) on loopback, checked against one oracle.

The integration tests start real processes: phub servers, MXNet 1.9.1 ps-lite schedulers,
servers and workers, torch gloo workers. Each worker checks its weights against the closed-form
NAG oracle (experiments.replay: after each warm-up exchange and after the last), so `verified` can
only be true when every system computed the right weights.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from experiments import network
from experiments.models import load_model, compute_schedule, profile_table, reference_values
from experiments.replay import VERIFY_TOLERANCE, bench_optimizer, run as replay_run
from experiments.runner import Options, run_exchange
from experiments.systems import SYSTEMS, WorkerSystem
from phub.launching.cluster import Cluster, Node
from phub.errors import ConfigError

HARNESS = [sys.executable, "-m", "experiments"]


@pytest.mark.parametrize("system", SYSTEMS)
def test_acceptance_resnet50_verifies(system):
    """The issue's acceptance command, for every system."""
    result = subprocess.run(HARNESS + ["bench", "exchange", "--system", system, "--model", "resnet50", "--workers", "2",
                                    "--iterations", "5", "--verify", "--json"],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["verified"] is True
    assert row["system"] == system and row["model"] == "resnet50" and row["workers"] == 2
    assert row["bytes_per_worker"] == 102197944  # 4 x 25,549,486 parameters
    assert 0 <= row["verify_max_error"] <= VERIFY_TOLERANCE
    assert row["compute"] == "zero" and row["cluster"] == {} and row["network"] == "loopback"
    assert len(row["seconds_per_iteration_all"]) == 5
    seconds = row["seconds_per_iteration"]
    assert seconds > 0 and abs(row["exchanges_per_s"] * seconds - 2) < 1e-9  # two workers
    assert abs(row["samples_per_s"] - 2 * 32 / seconds) < 1e-6  # resnet50: assumed batch 32 per GPU


@pytest.mark.parametrize("system", SYSTEMS)
def test_compute_replay_small_model_verifies(system):
    """googlenet (28 MB, 0.10 s of paper-derived compute) with the compute replay."""
    row = run_exchange(system, "googlenet", workers=2, iterations=2, warmup=1, verify=True,
                       options=Options(compute="replay", time_limit=120), quiet=True)
    assert row["verified"] is True
    assert row["compute"] == "replay" and row["compute_provenance"] == "paper-derived"
    assert row["compute_seconds_per_iteration"] == pytest.approx(0.10)
    # Every iteration replays all its forward and backward time: it cannot take less.
    assert min(row["seconds_per_iteration_all"]) >= 0.10 - 1e-3
    assert row["samples_per_s"] == pytest.approx(2 * row["batch_per_gpu"] / row["seconds_per_iteration"])


# Runs a command "on a node": logs (node, argv) to a file, then becomes the command. Stands in for
# the emulated rack's `ip netns exec NS` prefix, to show that every process goes through a node.
_WRAP = ("import json, os, sys; log, node, argv = sys.argv[1], sys.argv[2], sys.argv[3:]; "
         "f = open(log, 'a'); f.write(json.dumps([node, argv]) + '\\n'); f.close(); os.execvp(argv[0], argv)")


def _logged(cluster: Cluster, log: str) -> Cluster:
    def wrap(node: Node) -> Node:
        return Node(node.name, node.addresses, (sys.executable, "-c", _WRAP, log, node.name), node.rack)
    return Cluster(tuple(map(wrap, cluster.servers)), tuple(map(wrap, cluster.workers)), cluster.hierarchical,
                   extra={"link_gbps": 1.5})


@pytest.mark.parametrize("system,expected", [
    ("phub", {"pbox0": ["phub server"], "worker0": ["experiments.worker"], "worker1": ["experiments.worker"]}),
    ("pshard", {"shard0": ["phub server"], "shard1": ["phub server"], "worker0": ["experiments.worker"],
                "worker1": ["experiments.worker"]}),
    ("pslite-shard", {"shard0": ["socket", "DMLC", "DMLC"], "shard1": ["DMLC"], "worker0": ["experiments.worker"],
                      "worker1": ["experiments.worker"]}),
    ("gloo-ring", {"worker0": ["socket", "experiments.worker"], "worker1": ["experiments.worker"]}),
])
def test_every_process_starts_through_a_cluster_node(tmp_path, monkeypatch, system, expected):
    """A network's Cluster decides where each process runs; its `extra` lands in the row."""
    log = str(tmp_path / "argv.log")
    monkeypatch.setitem(network.NETWORKS, "logged",
                        lambda name, workers, options: _logged(network.loopback_cluster(name, workers, options), log))
    row = run_exchange(system, "synthetic:1", workers=2, iterations=1, warmup=0, verify=True,
                       options=Options(network="logged", time_limit=120), quiet=True)
    assert row["verified"] is True and row["cluster"] == {"link_gbps": 1.5} and row["network"] == "logged"
    started = {}
    for line in open(log):
        node, argv = json.loads(line)
        text = " ".join(argv)
        what = ("phub server" if " phub server" in text else "experiments.worker" if "experiments.worker" in text
                else "socket" if "socket" in text else "DMLC" if "import mxnet" in text else text)
        started.setdefault(node, []).append(what)
    assert {node: sorted(whats) for node, whats in started.items()} == \
        {node: sorted(whats) for node, whats in expected.items()}


def test_phub_two_racks_verifies():
    """`--racks 2`: one PBox per rack, two-phase reduction, the same oracle."""
    row = run_exchange("phub", "synthetic:1", workers=2, iterations=2, verify=True,
                       options=Options(racks=2, num_interfaces=2, time_limit=120), quiet=True)
    assert row["verified"] is True and row["racks"] == 2 and row["servers"] == 2 and row["interfaces"] == 2


def test_phub_simulating_racks_runs_one_pbox_and_says_so():
    """`--simulate-racks 3`: the paper's rack simulation on one PBox; its rows say R."""
    row = run_exchange("phub", "synthetic:1", workers=2, iterations=2, options=Options(simulated_racks=3,
                       num_interfaces=2, time_limit=120), quiet=True)
    assert row["simulated_racks"] == 3 and row["servers"] == 1 and row["interfaces"] == 2


def test_models_profile_provenance():
    rows = {row["model"]: row for row in profile_table()}
    assert len(rows) == 9
    for (quantity, model), (value, source, provenance) in reference_values().items():
        if quantity == "compute_seconds_per_iteration":
            assert rows[model]["provenance"] == "paper-derived" and rows[model]["compute_seconds_per_iteration"] == value
    assert {m for m, r in rows.items() if r["provenance"] == "estimated"} == \
        {"vgg11", "vgg19", "resnet18", "resnet50", "resnext269"}
    assert rows["resnet269"]["batch_per_gpu"] == 16  # 0.35 s x 44.02 samples/s = 15.4
    # FLOPs scale the estimates: vgg19 costs more than vgg11, per sample and per iteration.
    assert rows["vgg19"]["compute_seconds_per_iteration"] > rows["vgg11"]["compute_seconds_per_iteration"] > 0


def test_replay_schedule_spreads_compute_over_layers_by_flops():
    model = load_model("resnet50")
    assert [k for layer in model.layers for k in layer.keys] == list(range(len(model.arrays)))
    forward, backward = compute_schedule(model, "replay")
    assert sum(forward) + sum(backward) == pytest.approx(model.profile.seconds_per_iteration)
    assert sum(backward) == pytest.approx(2 * sum(forward))
    heaviest = max(range(len(model.layers)), key=lambda i: model.layers[i].forward_gflops)
    assert forward[heaviest] == max(forward)
    assert compute_schedule(model, "zero") == ([0.0] * len(model.layers), [0.0] * len(model.layers))
    with pytest.raises(ConfigError, match="no compute profile"):
        compute_schedule(load_model("synthetic:1"), "replay")


class _LocalNAG(WorkerSystem):
    """A single worker that runs NAG itself, `lr_factor` off the optimizer's learning rate."""

    def __init__(self, lr_factor):
        self.rank, self.num_workers, self.lr_factor = 0, 1, lr_factor

    def setup(self, sizes, initial, optimizer):
        self.w = [a.astype(np.float64) for a in initial]
        self.mom = [np.zeros(s) for s in sizes]
        self.g = [np.zeros(s) for s in sizes]
        self.opt = optimizer

    def write_gradient(self, key, values):
        self.g[key] = values.astype(np.float64)

    def push(self, key):
        o = self.opt
        g = o["rescale_grad"] * self.g[key] + o["wd"] * self.w[key]
        self.mom[key] = o["momentum"] * self.mom[key] + g
        self.w[key] = self.w[key] - o["learning_rate"] * self.lr_factor * (g + o["momentum"] * self.mom[key])

    def read_weights(self, key):
        return self.w[key]


class _WrongOnce(_LocalNAG):
    """_LocalNAG whose `wrong`-th exchange (1-based) sums the gradient twice."""

    def __init__(self, wrong):
        super().__init__(1.0)
        self.pushes, self.wrong = 0, wrong

    def push(self, key):
        self.pushes += key == 0
        if self.pushes == self.wrong:
            self.g[key] = 2 * self.g[key]
        super().push(key)


def test_oracle_accepts_right_weights_and_rejects_wrong_ones():
    model = load_model("synthetic:0.1")
    assert replay_run(_LocalNAG(1.0), model, "zero", iterations=3, warmup=0, verify=True)["verified"] is True
    with pytest.raises(SystemExit, match="differ from the oracle"):
        replay_run(_LocalNAG(1.001), model, "zero", iterations=3, warmup=0, verify=True)
    # a warm-up exchange is caught as it lands; a timed one by the check after the last exchange
    with pytest.raises(SystemExit, match="after exchange 1,"):
        replay_run(_WrongOnce(1), model, "zero", iterations=3, warmup=2, verify=True)
    with pytest.raises(SystemExit, match="after exchange 6,"):
        replay_run(_WrongOnce(4), model, "zero", iterations=3, warmup=2, verify=True)
    # and the timed iterations wait for no check, so their forward overlaps the exchange's tail
    timed = replay_run(_LocalNAG(1.0), model, "zero", iterations=3, warmup=2, verify=True)
    assert timed["checks"] == [[0.0, 0.0]] * 3
    assert bench_optimizer(4)["wd"] == 0.0  # see the NAG trap in the paper notes


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(ConfigError, match="--system gloo-hd"):
        run_exchange("gloo-hd", "resnet18", 2, 1)
    with pytest.raises(ConfigError, match="no compute profile"):
        run_exchange("phub", "synthetic:1", 2, 1, options=Options(compute="replay"))
    with pytest.raises(ConfigError, match="--racks applies to --system phub only"):
        run_exchange("gloo-ring", "synthetic:1", 2, 1, options=Options(racks=2))
    with pytest.raises(ConfigError, match="--simulate-racks runs phub's one-PBox rack simulation"):
        run_exchange("phub", "synthetic:1", 2, 1, verify=True, options=Options(simulated_racks=2))
    with pytest.raises(ConfigError, match="rack spec rack.yaml: cannot read it"):
        run_exchange("phub", "synthetic:1", 2, 1, options=Options(network="emulated", spec="rack.yaml"))
    result = subprocess.run(HARNESS + ["bench", "exchange", "--system", "nccl"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "--system nccl" in result.stderr and "gloo-ring" in result.stderr
