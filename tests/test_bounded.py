"""Every wait bounded, every bad value a one-line `phub: error:` naming the option, variable or
file (exit status non-zero, no traceback)."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import phub
from experiments.rack.rackspec import load_spec
from phub.errors import ConfigError, JobFailed

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def phub_cli(*args, timeout=60, env=None, module="phub"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env or ENV)


def one_line_error(result, *words):
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines()
             if line.startswith(("phub: error:", "python -m experiments: error:"))]
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_launch_names_the_ranks_that_never_connect_within_the_timeout():
    start = time.monotonic()
    result = phub_cli("launch", "-n", "2", "--timeout", "5", "--", "sleep", "1000", timeout=60)
    assert result.returncode != 0
    assert time.monotonic() - start < 15
    assert "rank(s) [0, 1] never connected" in result.stderr, result.stderr


def test_launch_says_at_once_when_the_workers_exit_without_connecting():
    start = time.monotonic()
    result = phub_cli("launch", "-n", "2", "--", "true", timeout=60)
    assert result.returncode != 0
    assert time.monotonic() - start < 12  # not the 30 s wait for the server
    assert "rank(s) [0, 1] exited (status 0) without ever connecting" in result.stderr, result.stderr


@pytest.mark.parametrize("args, words", [
    (["launch", "-n", "1", "--timeout", "inf", "--", "true"], ["--timeout", "inf"]),
    (["launch", "-n", "1", "--timeout", "nan", "--", "true"], ["--timeout"]),
    (["server", "--timeout", "-1"], ["--timeout"]),
    (["server", "--peers", "127.0.0.1:46000,nohostport"], ["--peers", "nohostport"]),
    (["server", "--max-job-bytes", "10"], ["--max-job-bytes"]),
    (["experiments", "bench", "exchange", "--model", "synthetic:inf"], ["synthetic:inf"]),
    (["experiments", "bench", "exchange", "--model", "synthetic:nan"], ["synthetic:nan"]),
    (["experiments", "rack", "down", "--spec", "/nonexistent.yaml"], ["/nonexistent.yaml"]),
])
def test_bad_values_are_one_line_errors(args, words):
    """Of phub's commands and of the harness's (`python -m experiments ...`)."""
    module = args.pop(0) if args[0] == "experiments" else "phub"
    one_line_error(phub_cli(*args, module=module), *words)


def test_a_non_utf8_hostfile_is_named(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_bytes(b"launcher: local\n\xff\xfe\n")
    one_line_error(phub_cli("hostfile", "--check", str(path)), str(path), "UTF-8")


def test_a_non_utf8_rack_spec_is_named(tmp_path):
    path = tmp_path / "rack.yaml"
    path.write_bytes(b"racks: 1\n\xff\n")
    with pytest.raises(ConfigError, match="rack.yaml: not UTF-8"):
        load_spec(path)


def test_rack_spec_bounds_name_the_key():
    with pytest.raises(ConfigError, match="'preflight.seconds'"):
        load_spec({"racks": 1, "workers_per_rack": 2, "pbox_interfaces": 1, "preflight": {"seconds": -1}})
    with pytest.raises(ConfigError, match="'scale.network'"):
        load_spec({"racks": 1, "workers_per_rack": 2, "pbox_interfaces": 1, "scale": {"network": 1e9}})
    with pytest.raises(ConfigError, match="'link_gbps'"):
        load_spec({"racks": 1, "workers_per_rack": 2, "pbox_interfaces": 1, "link_gbps": float("nan")})


def test_an_unreachable_rack_server_fails_the_job_not_the_core():
    port, other = _free_port(), _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "phub", "server", "--once", "--timeout", "1", "--port", str(port),
                             "--rack", "0", "--peers", f"127.0.0.1:{port},127.0.0.1:{other}", "--job", "0:0-0/2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    try:
        address = json.loads(proc.stdout.readline())["address"]
        with pytest.raises(JobFailed, match="cannot reach rack 1's server"):
            phub.connect(address, rank=0, num_workers=2, timeout=20)
        assert proc.wait(20) == 1
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("name, value", [("PHUB_SERVER", "127.0.0.1:abc"), ("PHUB_SERVER", "nohost"),
                                         ("PHUB_TIMEOUT", "inf"), ("PHUB_TIMEOUT", "-3")])
def test_bad_environment_variables_are_named(monkeypatch, name, value):
    env = {"PHUB_SERVER": "127.0.0.1:1", "PHUB_RANK": "0", "PHUB_NUM_WORKERS": "1", name: value}
    for key, text in env.items():
        monkeypatch.setenv(key, text)
    with pytest.raises(ConfigError, match=name):
        phub.connect()


def test_a_negative_or_infinite_call_timeout_is_refused():
    server = phub.Server(phub.ServerConfig()).start()
    try:
        kv = phub.connect(server.address, rank=0, num_workers=1, timeout=20)
        w = np.zeros(8, np.float32)
        kv.init("w", w)
        for bad in (-1, 0, float("inf")):
            with pytest.raises(ConfigError, match="timeout"):
                kv.pushpull("w", np.ones(8, np.float32), out=w, timeout=bad)
        kv.pushpull("w", np.ones(8, np.float32), out=w, timeout=20)  # the client still works
        np.testing.assert_array_equal(w, np.ones(8, np.float32))
        kv.close()
    finally:
        server.stop()


SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


@pytest.mark.parametrize("path, value, key", [
    (["rack", "max_link_mbt"], 100, "max_link_mbt"),  # a typo
    (["rack", "preflight"], {"seconds": -1}, "seconds"),
    (["experiments", "pbox", "models"], ["synthetic:0"], "models"),
    (["experiments", "pbox", "models"], ["synthetic:inf"], "models"),
    (["experiments", "chunk_sweep", "chunk_kb"], [0.001], "chunk_kb"),
    (["experiments", "pbox", "interfaces"], 100000, "interfaces"),
    (["repeats"], 10**9, "repeats"),
])
def test_the_config_schema_is_closed_and_bounded(path, value, key):
    import jsonschema
    import yaml

    config = yaml.safe_load((ROOT / "config/quick.yaml").read_text())
    node = config
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError) as info:
        jsonschema.validate(config, yaml.safe_load(SCHEMA.read_text()))
    error = info.value
    assert key in "/".join(map(str, error.absolute_path)) + error.message


def test_a_typo_in_rack_stops_the_dry_run_naming_the_key(tmp_path):
    import yaml

    config = yaml.safe_load((ROOT / "config/quick.yaml").read_text())
    config["rack"]["max_link_mbt"] = 100
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(path),
                          "--config", f"results_dir={tmp_path / 'results'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)
    assert run.returncode != 0
    assert "max_link_mbt" in run.stdout + run.stderr
    assert not (tmp_path / "results").exists()
