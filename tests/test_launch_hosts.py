"""`phub launch --hostfile` on several emulated nodes: network namespaces on one bridge, one
198.19.77.0/24 address each, which the launcher reaches through a remote-shell template
(`ip netns exec {node} sh -c`) exactly as it reaches real hosts through ssh: the server on the PBox
node, one worker per slot, their environment sent over the remote shell. Needs root and iproute2."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from phub.launching import hostfile
from phub.errors import ConfigError
from phub.launching.hosts import carried_line, on_node, torch_env

ROOT = Path(__file__).resolve().parents[1]
SUBNET = "198.19.77"  # inside this test's own namespaces only, on a bridge of their own
REMOTE_SHELL = "ip netns exec {node} sh -c"
PREFIX = f"phl{os.getpid() % 100000}"
SLOTS = {"n1": 2, "n2": 1, "n3": 1}  # worker nodes and their slots: 4 workers on 3 nodes, beside the PBox


def _netns_problem():
    if not shutil.which("ip"):
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    return None


needs_netns = pytest.mark.skipif(_netns_problem() is not None, reason=str(_netns_problem()))


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """The emulated nodes: a hostfile naming them (launcher ssh, the namespace remote shell)."""
    from experiments.rack import netns

    switch = f"{PREFIX}-sw"
    names = [f"{PREFIX}-pbox", *(f"{PREFIX}-{name}" for name in SLOTS)]
    made = []
    try:
        netns.add_namespace(switch)
        made.append(switch)
        netns.ip(switch, "link", "add", "br0", "type", "bridge")
        netns.ip(switch, "link", "set", "br0", "up")
        for index, name in enumerate(names):
            netns.add_namespace(name)
            made.append(name)
            netns.ip(name, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{index}", "netns", switch)
            netns.ip(switch, "link", "set", f"p{index}", "master", "br0", "up")
            netns.ip(name, "address", "add", f"{SUBNET}.{index + 1}/24", "dev", "eth0")
            netns.ip(name, "link", "set", "eth0", "up")
        data = {"launcher": "ssh", "remote_shell": REMOTE_SHELL,
                "pboxes": [{"name": names[0], "addresses": [f"{SUBNET}.1"]}],
                "workers": [{"name": name, "addresses": [f"{SUBNET}.{index + 2}"], "slots": SLOTS[short]}
                            for index, (name, short) in enumerate(zip(names[1:], SLOTS))]}
        path = tmp_path_factory.mktemp("hosts") / "hosts.yaml"
        path.write_text(yaml.safe_dump(data))
        yield path, names
    finally:
        for name in reversed(made):
            netns.delete_namespace(name)


def env():
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")


def launch(*args, timeout=400, **extra):
    return subprocess.run([sys.executable, "-m", "phub", "launch", "--timeout", "120", *args], cwd=ROOT,
                          env={**env(), **extra}, capture_output=True, text=True, timeout=timeout)


def epochs(out: str):
    """Rank 0's epoch lines, without their prefix."""
    return [line.split("] ", 1)[1] for line in out.splitlines() if "] epoch " in line]


def left_running(names):
    from experiments.rack import netns

    return {name: netns.namespace_pids(name) for name in names if netns.namespace_pids(name)}


@needs_netns
def test_torch_train_across_emulated_nodes_matches_the_single_machine_run(nodes):
    path, names = nodes
    example = ["python", "examples/torch_train.py", "--mode", "ddp", "--epochs", "1"]
    here = launch("-n", "4", "--", *example)
    assert here.returncode == 0, here.stderr[-3000:]
    # The nodes share this machine's host name, which resolves to a loopback address: gloo is told
    # which interface to advertise, as on a cluster whose host names do not resolve to its network.
    spread = launch("--hostfile", str(path), "--env", "GLOO_SOCKET_IFNAME", "--", *example, GLOO_SOCKET_IFNAME="eth0")
    assert spread.returncode == 0, spread.stderr[-3000:]
    assert epochs(spread.stdout) == epochs(here.stdout) and len(epochs(here.stdout)) == 1, (here.stdout, spread.stdout)
    assert f"[{names[1]} rank 0] epoch 1:" in spread.stdout  # prefixed with node and rank
    assert spread.stderr.strip().splitlines()[-1].startswith("phub: PHub carried 1 job(s), 4 worker(s)")
    assert not left_running(names)


PROBE = ("import os, sys, phub; client = phub.connect(); "
         "print(*(os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR')), flush=True); "
         "client.close(); sys.exit(3 if os.environ['RANK'] == os.environ.get('FAIL_RANK') "
         "and os.environ['PHUB_RESTART_COUNT'] < os.environ.get('FAIL_STARTS', '99') else 0)")


@needs_netns
def test_every_worker_learns_its_ranks_and_the_first_workers_address(nodes):
    path, names = nodes
    run = launch("--hostfile", str(path), "--", "python", "-c", PROBE)
    assert run.returncode == 0, run.stderr[-3000:]
    said = sorted(line for line in run.stdout.splitlines() if line.count(" ") >= 4)
    assert said == [f"[{names[1]} rank 0] 0 0 2 {SUBNET}.2", f"[{names[1]} rank 1] 1 1 2 {SUBNET}.2",
                    f"[{names[2]} rank 2] 2 0 1 {SUBNET}.2", f"[{names[3]} rank 3] 3 0 1 {SUBNET}.2"], run.stdout


@needs_netns
def test_a_failing_worker_is_named_with_its_node_and_a_restart_recovers(nodes):
    path, names = nodes
    os.environ["FAIL_RANK"] = "2"
    try:
        failed = launch("--hostfile", str(path), "--env", "FAIL_RANK", "--", "python", "-c", PROBE)
        assert failed.returncode == 1
        assert f"rank 2 on {names[2]} failed first (status 3)" in failed.stderr.splitlines()[-1], failed.stderr[-2000:]
        assert not left_running(names)
        os.environ["FAIL_STARTS"] = "1"  # only the first start fails
        again = launch("--hostfile", str(path), "--max-restarts", "1", "--env", "FAIL_RANK", "--env", "FAIL_STARTS",
                       "--", "python", "-c", PROBE)
        assert again.returncode == 0, again.stderr[-2000:]
        assert "restarting the job (1 of 1)" in again.stderr
    finally:
        os.environ.pop("FAIL_RANK", None)
        os.environ.pop("FAIL_STARTS", None)
    assert not left_running(names)


def test_a_hostfile_with_slots_and_a_remote_shell_makes_shell_nodes():
    data = {"launcher": "ssh", "pboxes": [{"name": "p", "addresses": ["10.0.0.1"]}],
            "workers": [{"name": "a", "addresses": ["10.0.0.2"], "slots": 2}, {"name": "b", "addresses": "10.0.0.3"}]}
    cluster = hostfile.parse_hostfile(data, "hosts.yaml")
    assert [w.name for w in cluster.workers] == ["a", "a", "b"] and all(w.shell for w in cluster.workers)
    assert cluster.workers[2].argv(["python", "-c", "print('hi there')"]) == \
        ["ssh", "-o", "BatchMode=yes", "b", "python -c 'print('\"'\"'hi there'\"'\"')'"]
    custom = hostfile.parse_hostfile(data, "hosts.yaml", remote_shell="ip netns exec {node} sh -c")
    argv, added, stdin = on_node(custom.workers[0], ["python", "x.py"], {"RANK": "0"})
    assert argv[:5] == ["ip", "netns", "exec", "a", "sh"] and added is None and b'"RANK": "0"' in stdin
    for bad, key in (({"slots": 0}, "workers[0].slots"), ({"remote_shell": 5}, "remote_shell")):
        broken = {**data, "workers": [{**data["workers"][0], **bad}]} if "slots" in bad else {**data, **bad}
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            hostfile.parse_hostfile(broken, "hosts.yaml")
    with pytest.raises(ConfigError, match="placeholder"):
        hostfile.parse_hostfile(data, "hosts.yaml", remote_shell="ssh {host}")


def test_torch_env_groups_local_ranks_by_host_and_carried_line_sums_cores():
    cluster = hostfile.parse_hostfile({"launcher": "srun", "pboxes": [{"name": "p", "addresses": ["10.0.0.1"]}],
                                       "workers": [{"name": "a", "addresses": ["10.0.0.2"], "slots": 2},
                                                   {"name": "b", "addresses": ["10.0.0.3"]}]})
    got = torch_env([(0, 0), (0, 1), (0, 2)], cluster.workers, {0: 3}, free_port=lambda node: 29500)
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in got] == [("0", "0", "2"), ("1", "1", "2"),
                                                                                   ("2", "0", "1")]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"]) for e in got} == {("10.0.0.2", "29500", "3")}
    line = carried_line([{"job": 0, "bytes": 1000, "rounds": 3}, {"job": 0, "bytes": 500, "rounds": 4}], {0: 3})
    assert line == "phub: PHub carried 1 job(s), 3 worker(s): 1.5 kB (1500 bytes) pushed and pulled in 4 round(s)"
    assert carried_line([], {0: 3}) is None
