"""Real machines named by a hostfile: checking it, the part of it a run uses, reading a node's
interfaces, and real exchanges through `--network hostfile` (launcher local, loopback addresses)."""
import json
import subprocess
import sys

import pytest
import yaml

from phub.launching import hostfile
from phub.errors import ConfigError

PHUB = [sys.executable, "-m", "phub"]
HARNESS = [sys.executable, "-m", "experiments"]
# Two racks: a PBox with two addresses in each, two workers per rack; every address on loopback.
HOSTS = {
    "launcher": "local",
    "pboxes": [{"name": "pbox0", "addresses": ["127.6.0.1", "127.6.0.2"], "rack": 0},
               {"name": "pbox1", "addresses": ["127.6.1.1", "127.6.1.2"], "rack": 1}],
    "workers": [{"name": f"w{i}", "addresses": [f"127.6.{2 + i // 2}.{1 + i % 2}"], "rack": i // 2} for i in range(4)],
}


@pytest.mark.parametrize("change, key", [
    ({"launcher": "pdsh"}, "'launcher'"),
    ({"nodes": []}, "'nodes'"),
    ({"workers": []}, "'workers'"),
    ({"workers": [{"name": "w0"}]}, "'workers[0].addresses'"),
    ({"workers": [{"name": "w0", "addresses": ["10.0.0.300"]}]}, "'workers[0].addresses'"),
    ({"workers": [{"name": "bad name", "addresses": ["10.0.0.3"]}]}, "'workers[0].name'"),
    ({"workers": [{"name": "w0", "addresses": ["10.0.0.3"], "rack": 5}]}, "'workers'"),
    ({"workers": [{"name": "w0", "addresses": ["10.0.0.3"], "gpus": 8}]}, "'workers[0].gpus'"),
    ({"pboxes": [{"name": "p", "addresses": ["10.0.0.1"], "rack": 1}]}, "'pboxes'"),
])
def test_a_bad_hostfile_names_its_key(change, key):
    with pytest.raises(ConfigError) as info:
        hostfile.parse_hostfile({**HOSTS, **change}, "hosts.yaml")
    assert key in str(info.value) and "hosts.yaml" in str(info.value)


def test_a_run_takes_the_racks_interfaces_and_workers_it_asks_for():
    cluster = hostfile.parse_hostfile(HOSTS)
    assert cluster.hierarchical and [len(p.addresses) for p in cluster.servers] == [2, 2]
    one = hostfile.select(cluster, workers=3, interfaces=1)
    assert not one.hierarchical and [w.name for w in one.workers] == ["w0", "w1", "w2"]
    assert one.servers[0].addresses == ("127.6.0.1",) and {w.rack for w in one.workers} == {0}
    two = hostfile.select(cluster, workers=2, racks=2)
    assert two.hierarchical and [(w.name, w.rack) for w in two.workers] == [("w0", 0), ("w2", 1)]
    with pytest.raises(ConfigError, match="5 workers"):
        hostfile.select(cluster, workers=5)
    with pytest.raises(ConfigError, match="3 interfaces"):
        hostfile.select(cluster, workers=1, interfaces=3)
    with pytest.raises(ConfigError, match="3 racks need 3 PBoxes"):
        hostfile.select(cluster, workers=3, racks=3)


def test_srun_runs_each_command_as_a_step_on_its_node():
    node = hostfile.parse_hostfile({**HOSTS, "launcher": "srun"}).workers[1]
    argv = node.argv(["python", "-m", "phub"])
    assert argv[:2] == ["srun", "--overlap"] and "--nodelist=w1" in argv and "--export=ALL" in argv
    assert argv[-3:] == ["python", "-m", "phub"]
    assert hostfile.parse_hostfile(HOSTS).workers[1].argv(["true"]) == ["true"]


def test_a_nodes_addresses_come_from_its_interfaces():
    shown = subprocess.run(["ip", "-o", "-4", "address", "show"], capture_output=True, text=True, check=True).stdout
    assert "127.0.0.1" in hostfile.interface_addresses(shown, "lo")
    assert not [a for a in hostfile.interface_addresses(shown) if a.startswith("127.")]  # loopback only by name
    sample = "2: ib0    inet 10.1.0.7/16 brd 10.1.255.255 scope global ib0\\       valid_lft forever\n"
    assert hostfile.interface_addresses(sample, "ib.*") == ["10.1.0.7"]
    assert hostfile.interface_addresses(sample, "eth.*") == []


def test_outside_a_slurm_allocation_from_slurm_says_what_to_do():
    with pytest.raises(ConfigError, match="not inside a SLURM allocation"):
        hostfile.from_slurm(environ={})


@pytest.fixture
def hosts_file(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(HOSTS))
    return path


def test_phub_hostfile_check_lists_the_nodes_or_names_the_fault(hosts_file, tmp_path):
    ok = subprocess.run(PHUB + ["hostfile", "--check", str(hosts_file)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "pbox1  rack 1  127.6.1.1, 127.6.1.2" in ok.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**HOSTS, "launcher": "telnet"}))
    run = subprocess.run(PHUB + ["hostfile", "--check", str(bad)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "'launcher'" in run.stderr and "bad.yaml" in run.stderr


@pytest.mark.parametrize("system, extra", [
    ("phub", ["--racks", "2", "--num-interfaces", "2"]),  # two-phase reduction across the two PBoxes
    ("pshard", []),
    ("gloo-ring", []),
])
def test_an_exchange_on_the_hostfiles_nodes_verifies(hosts_file, system, extra):
    run = subprocess.run(HARNESS + ["bench", "exchange", "--network", "hostfile", "--spec", str(hosts_file),
                                 "--system", system, "--model", "synthetic:2", "--workers", "4", "--iterations", "2",
                                 "--verify", "--json", "--time-limit", "120", *extra],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    row = json.loads(run.stdout.strip().splitlines()[-1])
    assert row["verified"] is True and row["workers"] == 4
    assert row["cluster"]["network"] == "hostfile" and row["cluster"]["launcher"] == "local"


def test_an_allocations_nodes_become_pboxes_then_workers_rack_by_rack():
    names = ["n01", "n02", "n03", "n04", "n05", "n06"]
    addresses = {n: [f"10.0.0.{i + 1}", f"10.1.0.{i + 1}"] for i, n in enumerate(names)}
    data = hostfile.assign_roles(names, addresses, pboxes=2)
    assert [(p["name"], p["rack"]) for p in data["pboxes"]] == [("n01", 0), ("n02", 1)]
    assert [(w["name"], w["rack"]) for w in data["workers"]] == [("n03", 0), ("n04", 0), ("n05", 1), ("n06", 1)]
    cluster = hostfile.parse_hostfile(data)  # what --from-slurm writes reads back
    assert cluster.hierarchical and cluster.workers[0].prefix[0] == "srun"
    assert cluster.servers[1].addresses == ("10.0.0.2", "10.1.0.2")
    with pytest.raises(ConfigError, match="do not split evenly over 2 rack"):
        hostfile.assign_roles(names[:5], addresses, pboxes=2)
