"""The raw TCP layouts that bound phub in benchmarks/data_path.py: each one runs, the C program
checks what it echoes and refuses bad arguments, and the bound is the fastest layout."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import raw_tcp  # noqa: E402

NBYTES = 2 * 1024 * 1024 + 4  # not a multiple of the echo's read size: a round ends mid-buffer


def needs_c():
    binary, why = raw_tcp.c_program()
    if binary is None:
        pytest.skip(f"the C layout cannot be built here: {why}")
    return binary


def assert_timed(run: dict) -> None:
    assert run["seconds"] > 0 and run["cpu"] > 0 and 0 < run["echo_cpu"] <= run["cpu"]


@pytest.mark.parametrize("update", [False, True])
@pytest.mark.parametrize("sockbuf", [0, 256 * 1024])
def test_c_layout_echoes_and_updates(update, sockbuf):
    needs_c()
    assert_timed(raw_tcp.c_seconds_per_exchange(NBYTES, 2, update=update, sockbuf=sockbuf))


def test_python_layout_with_fixed_buffers():
    assert_timed(raw_tcp.tcp_seconds_per_exchange(NBYTES, 2, sockbuf=256 * 1024))


def test_c_program_reports_every_round_of_every_worker():
    binary = needs_c()
    run = subprocess.run([binary, str(NBYTES), "3", "3"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert len(report["seconds"]) == 3 and all(len(rounds) == 3 for rounds in report["seconds"])
    assert len(report["worker_cpu"]) == 3 and report["echo_cpu"] > 0


@pytest.mark.parametrize("args", [[], ["2", "3", "2"], ["1024", "1", "2"], ["1024", "3", "0"],
                                  ["1024", "3", "2", "0", "sideways"]])
def test_c_program_refuses_bad_arguments(args):
    binary = needs_c()
    run = subprocess.run([binary, *args], capture_output=True, text=True, timeout=10)
    assert run.returncode == 2 and "usage: raw_tcp" in run.stderr


@pytest.mark.parametrize("update", [False, True])  # the bound, and the ideal server
def test_the_bound_is_the_fastest_layout(update):
    best = raw_tcp.best_raw_tcp(NBYTES, 2, update=update)
    names = {raw_tcp.layout_name(kind, sockbuf) for kind, sockbuf in raw_tcp.layouts()}
    assert set(best["layouts"]) == names and best["layout"] in names
    assert best["layouts"][best["layout"]] == min(best["layouts"].values())
    assert raw_tcp.layout_name(best["kind"], best["sockbuf"]) == best["layout"]
    assert_timed(best)
    assert set(best["layouts_steal"]) == names and all(0 <= s <= 1 for s in best["layouts_steal"].values())
    assert best["steal"] == best["layouts_steal"][best["layout"]]
