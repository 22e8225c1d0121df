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
    (["server", "--chunk-bytes", str(2**34)], ["--chunk-bytes", "2147483644"]),  # a frame's length is 32-bit
    (["server", "--chunk-bytes", "4098"], ["--chunk-bytes"]),
    (["server", "--cores", "65536"], ["--cores"]),
    (["server", "--port", "65536"], ["--port"]),
    (["server", "--port", "-1"], ["--port"]),
    (["server", "--port", "65535", "--cores", "2"], ["--port", "--cores", "65536"]),
    (["server", "--lanes-per-pair", "5000"], ["--lanes-per-pair"]),
    (["server", "--cores", "64", "--lanes-per-pair", "65"], ["--lanes-per-pair", "4160"]),
    (["server", "--workers", "4097"], ["--workers"]),
    (["launch", "-n", "4097", "--", "true"], ["--workers"]),
    (["launch", "-n", "1", "--max-restarts", "-1", "--", "true"], ["--max-restarts"]),
])
def test_bad_values_are_one_line_errors(args, words):
    """Of phub's commands and of the harness's (`python -m experiments ...`)."""
    module = args.pop(0) if args[0] == "experiments" else "phub"
    one_line_error(phub_cli(*args, module=module), *words)


@pytest.mark.parametrize("cores", [1, 2])
def test_the_last_port_is_a_port(cores):
    """Core c listens on --port + c: the base may be as high as leaves the last core a port."""
    assert phub.ServerConfig(port=65536 - cores, cores=cores).port == 65536 - cores
    with pytest.raises(ConfigError, match="--port"):
        phub.ServerConfig(port=65537 - cores, cores=cores)


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
                                         ("PHUB_TIMEOUT", "inf"), ("PHUB_TIMEOUT", "-3"),
                                         ("PHUB_JOB", "-1"), ("PHUB_JOB", str(2**32)),  # a frame's job is 32-bit
                                         ("PHUB_RANK", "-1"), ("PHUB_RANK", "4096"),
                                         ("PHUB_NUM_WORKERS", "0"), ("PHUB_NUM_WORKERS", "4097")])
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
    # NaN passes every bound of JSON Schema (each comparison is false): each number is checked for it
    *[(path, bad, path[-1]) for bad in (float("nan"), float("inf"), -float("inf")) for path in (
        ["rack", "max_link_mbit"], ["rack", "time_stretch"], ["rack", "preflight", "seconds"],
        ["rack", "preflight", "tolerance"], ["rack", "preflight", "budget_mbit"],
        ["experiments", "capacity", "link_gbps"], ["experiments", "chunk_sweep", "model_scale"])],
    (["experiments", "oversubscription", "ratios"], [2, float("nan")], "ratios"),
    (["experiments", "oversubscription", "ratios"], [float("inf")], "ratios"),
    (["warmup"], float("nan"), "warmup"),
])
def test_the_config_schema_is_closed_and_bounded(path, value, key):
    import jsonschema
    import yaml

    config = quick_config_with(path, value)
    with pytest.raises(jsonschema.ValidationError) as info:
        jsonschema.validate(config, yaml.safe_load(SCHEMA.read_text()))
    error = info.value
    assert key in "/".join(map(str, error.absolute_path)) + error.message


def quick_config_with(path, value) -> dict:
    """config/quick.yaml with the key at `path` (made if missing) set to `value`."""
    import yaml

    config = yaml.safe_load((ROOT / "config/quick.yaml").read_text())
    node = config
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return config


def dry_run(tmp_path, config: dict) -> subprocess.CompletedProcess:
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(path),
                           "--config", f"results_dir={tmp_path / 'results'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)


def test_a_typo_in_rack_stops_the_dry_run_naming_the_key(tmp_path):
    run = dry_run(tmp_path, quick_config_with(["rack", "max_link_mbt"], 100))
    assert run.returncode != 0
    assert "max_link_mbt" in run.stdout + run.stderr
    assert not (tmp_path / "results").exists()


# Values the schema admits but a point's emulated rack would not: each rack spec is checked when
# the grid is made, so the dry run stops, naming the point, before anything starts.
RACK_REFUSALS = [
    (["experiments", "oversubscription", "ratios"], [1000], "oversubscription/phub-o1000"),
    (["rack", "max_link_mbit"], 2000, "cross_rack/alexnet-r1"),  # its PBox NICs at 2x: 4000 Mbit/s
    (["experiments", "cross_rack", "workers_per_rack"], 250, "cross_rack/alexnet-r2"),
]


@pytest.mark.parametrize("path, value, point", RACK_REFUSALS)
def test_every_point_s_rack_spec_is_checked_with_the_grid(path, value, point):
    sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
    import points

    config = quick_config_with(path, value)
    with pytest.raises(ConfigError, match=f"rack spec of point {point}: .*emulated links must be"):
        points.points(config)
    assert points.points(dict(config, network="loopback"))  # nothing is shaped there


def test_a_point_s_rack_spec_stops_the_dry_run_in_one_line(tmp_path):
    run = dry_run(tmp_path, quick_config_with(["experiments", "oversubscription", "ratios"], [1000]))
    assert run.returncode != 0
    output = run.stdout + run.stderr
    assert "rack spec of point oversubscription/phub-o1000" in output and "Traceback" not in output, output
    assert 'File "' not in output, output  # no stack
    assert not (tmp_path / "results").exists()
