"""The emulated rack: real network namespaces, bridges, veth links shaped with htb, real phub processes.

The tests that build racks need CAP_NET_ADMIN (CI runs them as root) and skip, saying so, without
it. Spec checks, the plan and the privilege messages need nothing.
"""
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import phub
from experiments.rack import netns, preflight, rackbuild, runstate
from experiments.rack.emulated import EmulatedRack
from experiments.rack.rackspec import load_spec
from experiments.rack.topology import make_plan
from phub.errors import ConfigError
from test_topologies import assert_nag_oracle_everywhere, nag, run

SPECS = Path(__file__).resolve().parent.parent / "config" / "racks"
TINY = {"racks": 1, "workers_per_rack": 1, "pbox_interfaces": 1, "scale": {"network": 100}, "preflight": False}
PHUB = [sys.executable, "-m", "phub"]
HARNESS = [sys.executable, "-m", "experiments"]
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]

privileged = pytest.mark.skipif(
    netns.privilege_problem() is not None or not netns.cap_net_admin(),
    reason=f"needs CAP_NET_ADMIN (run as root): {netns.privilege_problem() or 'not root'}")


# -- the spec, without privileges --------------------------------------------------------------
@pytest.mark.parametrize("change, key", [
    ({"racks": 0}, "'racks'"),
    ({"workers_per_rack": "two"}, "'workers_per_rack'"),
    ({"pbox_interfaces": 1.5}, "'pbox_interfaces'"),
    ({"link_gbps": -10}, "'link_gbps'"),
    ({"oversubscription": 0}, "'oversubscription'"),
    ({"oversubscription": 2, "uplink_gbps": 10}, "'uplink_gbps'"),
    ({"scale": {"network": 1}}, "'scale.network'"),  # 10 Gbit/s per link: more than the CPU can shape
    ({"scale": {"netwrk": 50}}, "'scale.netwrk'"),
    ({"uplink_rate": 5}, "'uplink_rate'"),
    ({"preflight": {"tolerance": 2}}, "'preflight.tolerance'"),
    ({"port": 80}, "'port'"),
    ({"queueing": "sfq"}, "'queueing'"),
])
def test_a_bad_spec_value_names_its_key(change, key):
    with pytest.raises(ConfigError) as info:
        load_spec({"racks": 2, "workers_per_rack": 2, "pbox_interfaces": 2, **change})
    assert key in str(info.value)


def test_a_bad_value_in_a_spec_file_names_the_file_and_key(tmp_path):
    path = tmp_path / "rack.yaml"
    path.write_text("racks: 2\nworkers_per_rack: 2\npbox_interfaces: -1\n")
    with pytest.raises(ConfigError, match=r"rack\.yaml: 'pbox_interfaces' must be an integer in 1\.\.64, got -1"):
        load_spec(str(path))
    result = subprocess.run(HARNESS + ["rack", "up", "--spec", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "'pbox_interfaces'" in result.stderr


def test_shipped_specs_scale_the_paper_settings():
    spec = load_spec(SPECS / "oversub2.yaml")
    assert (spec.mbit("host"), spec.mbit("pbox_nic"), spec.mbit("uplink")) == (200.0, 200.0, 400.0)
    assert spec.oversubscription == 2 and spec.scale_time == pytest.approx(56 / 280)
    assert load_spec(SPECS / "rack8.yaml").num_workers == 8
    assert load_spec(SPECS / "2x2.yaml", {"oversubscription": 4}).mbit("uplink") == 100.0  # a sweep's override
    # the default s_n brings the paper's link rate down to 200 Mbit/s; s_m defaults to s_n
    spec = load_spec({"racks": 1, "workers_per_rack": 1, "pbox_interfaces": 1, "link_gbps": 56})
    assert spec.mbit("host") == pytest.approx(200.0) and spec.scale_time == 1.0


def test_plan_uses_the_benchmarking_range_and_run_scoped_names():
    plan = make_plan(load_spec(SPECS / "2x2.yaml"), "0a1b2c")
    addresses = [a for h in plan.workers + plan.pboxes + plan.probes for a in h.addresses]
    assert len(set(addresses)) == len(addresses) == 4 + 4 + 3
    assert all(a.startswith(("198.18.", "198.19.")) for a in addresses)
    assert all(ns.startswith("phub-0a1b2c-") for ns in plan.namespaces) and len(set(plan.namespaces)) == 10
    ifnames = [end.ifname for link in plan.links for end in (link.lower, link.upper)]
    assert max(map(len, ifnames)) <= 15 and plan.bridges == ("tor0", "tor1", "core")
    assert [w.rack for w in plan.workers] == [0, 0, 1, 1]


def test_without_privileges_the_message_says_what_is_missing_and_how_to_run(monkeypatch):
    monkeypatch.setattr(netns, "cap_net_admin", lambda: False)
    monkeypatch.setattr(netns, "user_namespace_detail", lambda: "Operation not permitted")
    message = netns.privilege_problem()
    assert "CAP_NET_ADMIN" in message and "Operation not permitted" in message
    assert "root" in message and "network: loopback" in message
    monkeypatch.setattr(netns, "user_namespace_detail", lambda: None)
    assert "user namespace" in netns.privilege_problem()


# -- a real 2-rack rack -----------------------------------------------------------------------
def _root_namespace():
    """This process's namespace: its interface names and routes (the rack must not change them)."""
    links = sorted(line.split(":")[1].strip() for line in netns.run(["ip", "-o", "link", "show"]).splitlines())
    return links, netns.run(["ip", "route", "show", "table", "all"])


@pytest.fixture(scope="module")
def rack():
    before = _root_namespace()
    rack = EmulatedRack(SPECS / "2x2.yaml")
    rack.up()
    rack.root_before = before
    yield rack
    rack.down()


@privileged
def test_every_link_measures_within_10_percent_of_its_rate(rack):
    links = rack.cluster.extra["links"]
    assert sorted(r["kind"] for r in links) == ["host"] * 4 + ["pbox_nic"] * 4 + ["uplink"] * 2
    for row in links:
        for direction in ("up_mbit", "down_mbit"):
            assert abs(row[direction] / row["configured_mbit"] - 1) <= 0.10, row
    extra = rack.cluster.extra
    assert extra["configured_mbit"] == {"host": 200.0, "pbox_nic": 200.0, "uplink": 400.0}
    assert extra["scale"] == {"network": 50.0, "model": 50.0, "time": 1.0} and extra["port"] == 19000


@privileged
def test_pbox_nics_carry_traffic_independently(rack):
    """Both NICs of a PBox at full rate at once, each way: ARP and routing keep each NIC's traffic on it."""
    nics = [t for t in preflight.transfers(rack.plan) if t.link.name in ("pbox0.nic0", "pbox0.nic1")]
    for direction in ("up", "down"):
        group = [t for t in nics if t.direction == direction]
        for t, rate in zip(group, preflight.run_round(group, rack.spec.preflight)):
            assert abs(rate / t.link.rate_mbit - 1) <= 0.10, (t.link.name, direction, rate)


def _sent_by_class(ns: str, dev: str) -> dict:
    """{classid: (bytes, packets)} sent by each htb class on `dev` so far."""
    out, sent, current = netns.run(["tc", "-n", ns, "-s", "class", "show", "dev", dev]), {}, None
    for line in out.splitlines():
        words = line.split()
        if words[:2] == ["class", "htb"]:
            current = words[2]
        elif words[:1] == ["Sent"] and current:
            sent[current] = (int(words[1]), int(words[3]))
    return sent


@privileged
def test_fair_queueing_puts_each_peer_in_its_bucket_and_acks_first(rack):
    """A bulk transfer from worker 0 to its rack's probe (198.19.0.254) fills the probe's bucket
    on the worker's egress; the probe's pure ACKs coming back take the ACK class of the switch port."""
    host = next(t for t in preflight.transfers(rack.plan) if t.link.name == "w0" and t.direction == "up")
    bucket = rackbuild.bucket_class(254 % rack.plan.fair_buckets)
    before = (_sent_by_class(host.link.lower.ns, "eth0"), _sent_by_class(rack.plan.switch_ns, "w0"))
    preflight.run_round([host], rack.spec.preflight)
    after = (_sent_by_class(host.link.lower.ns, "eth0"), _sent_by_class(rack.plan.switch_ns, "w0"))
    sent_bytes = after[0][bucket][0] - before[0][bucket][0]
    expected = host.link.rate_mbit * 1e6 / 8 * rack.spec.preflight.seconds
    assert sent_bytes >= 0.5 * expected, (bucket, sent_bytes, expected)
    others = sum(after[0][c][0] - before[0][c][0] for c in after[0] if c not in (bucket, "1:1", "1:2"))
    assert others < 0.01 * sent_bytes
    assert after[1]["1:2"][1] - before[1]["1:2"][1] > 10  # the ACKs, on the way back


def test_shaping_commands_share_a_link_among_peers_with_acks_first():
    fair = rackbuild.shaping_commands("eth3", 200.0, "fair", "dst", buckets=16)
    classes = [c for c in fair if c.startswith("class")]
    filters = [c for c in fair if c.startswith("filter")]
    assert len(classes) == 2 + 16 and len(filters) == 1 + 16
    assert "match u8 0x0f 0x0f at 19" in filters[-1]  # tc reads these as hex
    assert "rate 200000kbit ceil 200000kbit" in classes[0] and "prio 0" in classes[1]
    guaranteed = sum(int(c.split(" rate ")[1].split("kbit")[0]) for c in classes[1:])
    assert guaranteed <= 200000  # children never promise more than the link
    assert all(" at 19 " in f for f in filters[1:])  # the destination's last octet
    assert all(" at 15 " in f for f in rackbuild.shaping_commands("w0", 200.0, "fair", "src")
               if f.startswith("filter") and "protocol 6" not in f)
    assert rackbuild.shaping_commands("eth0", 50.0, "fifo", "dst")[0].endswith("htb default 1")
    with pytest.raises(ValueError, match="sfq"):
        rackbuild.shaping_commands("eth0", 50.0, "sfq", "dst")
    with pytest.raises(ValueError, match="power of two"):
        rackbuild.shaping_commands("eth0", 50.0, "fair", "dst", buckets=6)
    # as many buckets as a rack's busiest link has peers: 2x2 -> 2, rack8 -> 8
    assert make_plan(load_spec(SPECS / "2x2.yaml"), "0a1b2c").fair_buckets == 2
    assert make_plan(load_spec(SPECS / "rack8.yaml"), "0a1b2c").fair_buckets == 8


def test_a_pbox_of_several_racks_keeps_the_racks_exchange_apart_from_its_workers_traffic():
    """NIC k of every PBox and worker k of every rack end in the same octet: on a PBox's links of a
    multi-rack plan the buckets are doubled by the peer's role (second octet 18: worker, 19: PBox)."""
    two = make_plan(load_spec(SPECS / "2x2.yaml"), "0a1b2c")
    one = make_plan(load_spec(SPECS / "rack8.yaml"), "0a1b2c")
    assert {link.kind: rackbuild.link_roles(link, two) for link in two.links if link.rate_mbit} == \
        {"host": 1, "pbox_nic": 2, "uplink": 1}
    assert {rackbuild.link_roles(link, one) for link in one.links} == {1}
    commands = rackbuild.shaping_commands("eth0", 200.0, "fair", "dst", buckets=2, roles=2)
    filters = [c for c in commands if c.startswith("filter") and "protocol 6" not in c]
    assert len(filters) == 4 and len({f.split("flowid ")[1] for f in filters}) == 4
    assert "match u8 0x01 0x01 at 19 match u8 0x01 0x01 at 17" in filters[-1]  # PBox role, odd last octet
    assert all(" at 13 " in f for f in rackbuild.shaping_commands("p0n0", 200.0, "fair", "src", 2, 2)
               if f.startswith("filter") and "protocol 6" not in f)
    assert [int(a.split(".")[1]) & 1 for a in (two.workers[0].addresses[0], two.pboxes[1].addresses[0])] == [0, 1]
    guaranteed = sum(int(c.split(" rate ")[1].split("kbit")[0]) for c in commands if c.startswith("class"))
    assert guaranteed <= 2 * 200000  # 1:1 holds the link; its children share no more than it
    with pytest.raises(ValueError, match="roles"):
        rackbuild.shaping_commands("eth0", 50.0, "fair", "dst", roles=3)


@privileged
def test_rack_is_isolated_and_leaves_the_root_namespace_alone(rack):
    assert rackbuild.check_isolation(rack.plan) == []
    for host in rack.plan.workers + rack.plan.pboxes:
        assert "default" not in netns.ip(host.ns, "route", "show", "table", "all")
        tcp = netns.run(netns.exec_argv(host.ns) + ["sysctl", "-n", "net.ipv4.tcp_congestion_control"]).strip()
        assert tcp == netns.TCP_CONGESTION == rack.cluster.extra["tcp_congestion"]
    assert _root_namespace() == rack.root_before
    cluster = rack.cluster
    assert cluster.hierarchical and [s.addresses for s in cluster.servers] == [
        ("198.19.0.1", "198.19.0.2"), ("198.19.1.1", "198.19.1.2")]
    assert cluster.workers[3].prefix == ("ip", "netns", "exec", rack.plan.workers[3].ns)


def _tx_bytes(ns, dev, direction="tx"):
    return json.loads(netns.ip(ns, "-s", "-j", "link", "show", "dev", dev))[0]["stats64"][direction]["bytes"]


@privileged
def test_two_phase_reduction_on_the_rack_matches_the_oracle(rack, tmp_path):
    ports = ["p0n0", "p0n1", "p1n0", "p1n1"]
    before = {p: _tx_bytes(rack.plan.switch_ns, p) for p in ports}
    sent_before = {p: _tx_bytes(rack.plan.switch_ns, p, "rx") for p in ports}
    assert_nag_oracle_everywhere(run(tmp_path, rack.cluster, 4, nag(4), cores=2))
    # the workers' pushes reached each PBox through both of its NICs
    pushed = {p: _tx_bytes(rack.plan.switch_ns, p) - before[p] for p in ports}
    for rack_ports in (ports[:2], ports[2:]):
        total = sum(pushed[p] for p in rack_ports)
        assert all(pushed[p] > 0.2 * total for p in rack_ports), pushed
    # what each PBox sent (results to its workers, partials and totals to the other rack) left
    # through its NICs in the shares its lanes have (those of the pushes): the racks' links are
    # one per interface. With every rack link on the first NIC, that NIC's share would be ~0.15 more.
    sent = {p: _tx_bytes(rack.plan.switch_ns, p, "rx") - sent_before[p] for p in ports}
    for rack_ports in (ports[:2], ports[2:]):
        first = rack_ports[0]
        pushed_share = pushed[first] / sum(pushed[p] for p in rack_ports)
        sent_share = sent[first] / sum(sent[p] for p in rack_ports)
        assert abs(sent_share - pushed_share) < 0.05, (sent, pushed)


def _netns_inodes(namespaces):
    return {os.stat(f"/run/netns/{ns}").st_ino for ns in namespaces}


def _processes_in(inodes):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino in inodes:
                found.append(int(pid))
        except OSError:
            pass
    return found


def _start_in(node, code="import time; time.sleep(120)"):
    """A process on a node (that would outlive the test if the teardown missed it)."""
    return subprocess.Popen(node.argv([sys.executable, "-c", code]), start_new_session=True)


@privileged
def test_teardown_leaves_no_namespace_bridge_or_process(rack):
    cluster, plan = rack.cluster, rack.plan
    inodes = _netns_inodes(plan.namespaces)
    server = subprocess.Popen(cluster.servers[0].argv(PHUB + ["server", "--workers", "2", "--interfaces",
                                                              ",".join(cluster.servers[0].addresses)]),
                              stdout=subprocess.PIPE, start_new_session=True)
    assert json.loads(server.stdout.readline())["event"] == "ready"  # a real phub server, waiting for workers
    lingering = [server, _start_in(cluster.workers[2])]
    assert len(_processes_in(inodes)) >= 2
    report = rack.down()
    assert set(report["namespaces"]) == set(plan.namespaces)
    for proc in lingering:
        assert proc.wait(timeout=10) is not None and proc.pid in report["processes"]
    assert not set(plan.namespaces) & set(netns.list_namespaces())
    assert _processes_in(inodes) == []
    assert _root_namespace() == rack.root_before  # no bridge or veth surfaced in the root namespace
    assert not os.path.exists(os.path.join(runstate.state_dir(), f"{plan.run_id}.json"))
    assert rack.down() == {"namespaces": [], "processes": []}  # idempotent


# -- crashes and signals ------------------------------------------------------------------------
_CRASHING = """
import json, subprocess, sys
from experiments.rack.emulated import EmulatedRack
rack = EmulatedRack(json.loads(sys.argv[1]))
cluster = rack.up()
child = subprocess.Popen(cluster.workers[0].argv([sys.executable, "-c", "import time; time.sleep(120)"]),
                         start_new_session=True)
print(json.dumps({"run_id": rack.run_id, "namespaces": rack.plan.namespaces, "child": child.pid}), flush=True)
sys.stdin.read()  # until the test kills this process
"""


def _start_creator(code, spec, ignore_sigint=False):
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ignore)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    assert line, f"the rack creator did not come up: {proc.stderr.read() if proc.poll() is not None else 'timeout'}"
    return proc, json.loads(line)


def _close(proc):
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        stream.close()


def _gone(pid, timeout=10.0):
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


@privileged
def test_a_crashed_run_is_detected_as_stale_and_cleaned():
    creator, info = _start_creator(_CRASHING, TINY)
    creator.kill()  # SIGKILL: no chance to clean up
    creator.wait()
    _close(creator)
    assert set(info["namespaces"]) <= set(netns.list_namespaces())  # left behind
    stale = {r.run_id: r for r in runstate.load_runs() if r.stale}
    assert info["run_id"] in stale
    status = subprocess.run(HARNESS + ["rack", "status", "--json"], capture_output=True, text=True, timeout=60)
    row = next(r for r in json.loads(status.stdout)["runs"] if r["run_id"] == info["run_id"])
    assert row["stale"] and row["processes"] == 1
    down = subprocess.run(HARNESS + ["rack", "down", "--all-stale"], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert not set(info["namespaces"]) & set(netns.list_namespaces())
    assert _gone(info["child"]), "the process inside the crashed run's namespace survived"


_SIGNALLED = """
import json, sys
from experiments.rack.emulated import EmulatedRack
with EmulatedRack(json.loads(sys.argv[1])) as cluster:
    print(json.dumps({"namespaces": [n.prefix[-1] for n in cluster.workers + cluster.servers]}), flush=True)
    sys.stdin.read()
"""


@privileged
@pytest.mark.parametrize("sig, ignored", [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGINT, True)],
                         ids=["SIGTERM", "SIGINT", "SIGINT-inherited-ignored"])
def test_the_context_manager_tears_down_on_signals(sig, ignored):
    """Also when the process was started with SIGINT ignored (a background job of some shells)."""
    creator, info = _start_creator(_SIGNALLED, TINY, ignore_sigint=ignored)
    creator.send_signal(sig)
    creator.wait(timeout=30)
    _close(creator)
    assert not set(info["namespaces"]) & set(netns.list_namespaces())


@privileged
def test_a_failed_preflight_names_the_link_and_removes_the_rack(monkeypatch):
    spec = dict(TINY, preflight={"seconds": 0.3})
    original = rackbuild.shape

    def misshape(ns, dev, mbit, *how):  # the PBox's NIC runs at half its rate
        original(ns, dev, mbit / 2 if "pbox" in ns else mbit, *how)

    monkeypatch.setattr(rackbuild, "shape", misshape)
    rack = EmulatedRack(spec)
    with pytest.raises(netns.RackError, match=r"PBox NIC link pbox0\.nic0 \(up\): measured"):
        rack.up()
    assert not set(rack.plan.namespaces) & set(netns.list_namespaces())


def _python_for_nobody():
    """A Python that user nobody may run, in a user namespace (where the rack re-runs itself), with
    phub and the lab importable, as (python, env for it): this interpreter, or else the system's
    of the same version with this one's packages on PYTHONPATH (a virtual environment's
    interpreter often links into root's home, which nobody may not read). Skips the test saying
    why when there is none."""
    import experiments

    skip = "needs root (to become user nobody) and a Python with phub that nobody may run: "
    if os.geteuid() != 0:
        pytest.skip(skip + "not root")
    packages = {str(Path(module.__file__).resolve().parents[1]) for module in (phub, experiments, np)}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sorted(packages)))
    why = "no system Python of this version"
    for python, with_env in ((sys.executable, None), (f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}", env)):
        if not os.access(python, os.X_OK):
            continue
        probe = subprocess.run(NOBODY + ["unshare", "--user", "--map-root-user", "sh", "-c",
                                         'exec "$0" -c "import phub, experiments, numpy"', python],
                               capture_output=True, timeout=60, env=with_env)
        if probe.returncode == 0:
            return python, with_env
        why = probe.stderr.decode().strip()[-300:]
    pytest.skip(skip + why)


def test_an_unprivileged_user_gets_a_rack_in_a_user_namespace():
    """As user nobody (no CAP_NET_ADMIN): `python -m experiments rack up --hold` re-runs itself in a user namespace."""
    python, env = _python_for_nobody()
    if netns.user_namespace_detail() is not None:
        pytest.skip(f"unprivileged user namespaces are not allowed here: {netns.user_namespace_detail()}")
    where = Path(tempfile.mkdtemp())  # readable by nobody, unlike pytest's tmp_path
    os.chmod(where, 0o755)
    spec = where / "tiny.json"
    spec.write_text(json.dumps(dict(TINY, preflight={"seconds": 0.3})))
    os.chmod(spec, 0o644)
    try:
        proc = subprocess.Popen([*NOBODY, python, "-m", "experiments", "rack",
                                 "up", "--spec", str(spec), "--hold", "--json"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=where, env=env)
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        summary = json.loads(proc.stdout.readline()) if ready else None
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    finally:
        shutil.rmtree(where)
    assert summary and summary["measured_mbit"]["host"]["min_mbit"] > 90, err
    assert proc.returncode == 0 and "removed run" in err
