"""`phub doctor` as a user runs it, and the verbs transport refusing to start where it cannot run."""
import glob
import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

import phub
from phub.launching import doctor
from phub.errors import ConfigError
from phub.network.rdma import verbs

PHUB = [sys.executable, "-m", "phub"]
KEYS = {"python", "cpu", "interfaces", "privileges", "rdma", "libraries", "transports", "modes"}


def run(*args, env=None, timeout=120):
    return subprocess.run(PHUB + list(args), capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def report():
    result = run("doctor", "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def test_doctor_json_describes_this_machine(report):
    assert set(report) == KEYS
    cpu = report["cpu"]
    assert cpu["count"] == os.cpu_count()
    assert cpu["usable"] == len(os.sched_getaffinity(0))
    assert len(cpu["numa_nodes"]) == len(glob.glob("/sys/devices/system/node/node[0-9]*"))
    assert [nic["name"] for nic in report["interfaces"]] == sorted(os.listdir("/sys/class/net"))
    for nic in report["interfaces"]:
        try:
            with open(f"/sys/class/net/{nic['name']}/speed") as f:
                raw = int(f.read())
        except (OSError, ValueError):
            raw = None
        assert nic["speed_mbps"] == (raw if raw and raw > 0 else None)
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))


def test_doctor_libraries_and_privileges(report):
    import numpy

    libs = report["libraries"]
    assert set(libs) == {"numpy", "mxnet", "torch"} and libs["numpy"] == numpy.__version__
    for name in ("mxnet", "torch"):
        try:
            expected = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            expected = None
        assert libs[name] == expected
    with open("/proc/self/status") as f:
        cap_eff = int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)
    assert report["privileges"]["cap_net_admin"] == bool(cap_eff >> 12 & 1)
    assert isinstance(report["privileges"]["netns"], bool) and report["privileges"]["netns_detail"]


def test_doctor_transports_and_modes_agree_with_the_probes(report):
    assert report["transports"]["tcp"] == {"available": True, "reason": None}
    assert report["modes"]["loopback"] == {"available": True, "reason": None}
    rdma, verbs_status = report["rdma"], report["transports"]["verbs"]
    assert verbs_status == doctor.verbs_transport(rdma)
    assert verbs_status["available"] is verbs_status["hardware"] is bool(rdma["usable"])
    if not rdma["usable"]:
        assert rdma["reason"] and verbs_status["reason"] == rdma["reason"]
    assert report["transports"]["soft-verbs"] == {"available": True, "reason": None}  # Linux: abstract sockets
    rack = report["modes"]["emulated_rack"]
    if rack["available"]:
        assert report["privileges"]["netns"] and report["privileges"]["cap_net_admin"] is not False
    else:
        assert rack["reason"]


def test_doctor_text_names_every_transport_and_mode(report):
    result = run("doctor")
    assert result.returncode == 0 and "Traceback" not in result.stderr
    text = result.stdout
    for needle in ("cpu ", f"{os.cpu_count()} cores", "transports", "    tcp            yes", "    verbs          no: ",
                   "loopback       yes", "emulated rack", "numpy " + report["libraries"]["numpy"]):
        assert needle in text, needle
    assert report["transports"]["verbs"]["reason"] in text


def test_a_pyverbs_that_fails_to_load_is_reported_as_a_sentence(tmp_path):
    stand_in = tmp_path / "pyverbs"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text(
        "raise ImportError('libibverbs.so.1: cannot open shared object file: No such file or directory')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    result = run("doctor", "--json", env=env)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rdma = json.loads(result.stdout)["rdma"]
    assert rdma["pyverbs"] is False
    assert rdma["reason"] == ("pyverbs is installed but does not load: libibverbs.so.1: cannot open shared object "
                              "file: No such file or directory")
    text = run("doctor", env=env).stdout
    assert "verbs          no: pyverbs is installed but does not load: libibverbs.so.1" in text


# -- choosing the verbs transport ----------------------------------------------------------------
def verbs_reason():
    return doctor.verbs_transport(verbs.probe())["reason"]


def test_transport_option_is_validated():
    assert phub.ServerConfig().transport == "tcp"
    with pytest.raises(ConfigError, match="ServerConfig.transport must be one of tcp, verbs, soft-verbs, got 'rdma'"):
        phub.ServerConfig(transport="rdma")
    assert "--transport" not in phub.ServerConfig().to_argv()
    argv = phub.ServerConfig(transport="verbs").to_argv()
    assert argv[argv.index("--transport") + 1] == "verbs"
    doctor.require_transport("tcp")
    with pytest.raises(ConfigError, match="transport 'udp' is not one of tcp, verbs"):
        doctor.require_transport("udp")


def test_verbs_server_fails_at_start_with_the_doctors_explanation():
    server = phub.Server(phub.ServerConfig(transport="verbs"))
    with pytest.raises(ConfigError) as info:
        server.start()
    assert str(info.value).startswith("transport 'verbs' cannot run here: ")
    assert verbs_reason() in str(info.value)
    assert server.pids == []  # nothing was started


def test_verbs_on_the_command_line_fails_with_the_same_explanation():
    reason = verbs_reason()
    result = run("server", "--transport", "verbs", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stdout == "" and f"phub: error: transport 'verbs' cannot run here: {reason}" in result.stderr
    result = run("launch", "-n", "1", "--transport", "verbs", "--", sys.executable, "-c", "pass", timeout=60)
    assert result.returncode != 0 and reason in result.stderr
    result = run("server", "--transport", "rdma")
    assert result.returncode == 2 and "invalid choice: 'rdma'" in result.stderr
