"""What bounded a run (experiments.monitor): the summary of made-up samples, and a real run."""
import os

import pytest

from experiments.monitor import (Monitor, Sample, Stolen, block, classify, floors, machine_cpu, median_share, settle,
                                 stolen_words, summarize)

NS_W, NS_S = "net:[1]", "net:[2]"


def _samples(seconds=4.0, period=0.5, busy_per_s=1.0, worker_cpu=0.3, server_cpu=0.6, link_bytes_per_s=5e6,
             timeouts_at=(), steal_per_s=0.0):
    """Two workers (pids 11, 12 in NS_W) and a server (pid 20 in NS_S) working at steady rates;
    the server's namespace resends 10 segments a second and takes a timeout at each of `timeouts_at`."""
    out = []
    for i in range(int(seconds / period) + 1):
        t = i * period
        out.append(Sample(t=t, busy=busy_per_s * t,
                          procs={11: (worker_cpu * t, "experiments.worker"), 12: (worker_cpu * t / 2, "experiments.worker"),
                                 20: (server_cpu * t, "phub server")},
                          links={f"{NS_W}/veth0": (int(link_bytes_per_s * t), int(link_bytes_per_s * t / 2)),
                                 f"{NS_S}/eth0": (int(link_bytes_per_s * t / 4), 0)},
                          pid_ns={11: NS_W, 12: NS_W, 20: NS_S},
                          tcp={NS_W: (0, 0), NS_S: (int(10 * t), sum(1 for x in timeouts_at if x <= t))},
                          steal=steal_per_s * t))
    return out


def _ranks(start=1.0, end=3.0, paused=0.0, verify_cpu=0.0):
    return [{"rank": 0, "pid": 11, "window": (start, end), "paused": paused, "verify_cpu": verify_cpu},
            {"rank": 1, "pid": 12, "window": (start, end), "paused": 0.0, "verify_cpu": 0.0}]


def test_steady_rates_come_out_exactly():
    got = summarize(_samples(server_cpu=0.7), _ranks(), cores=2, host_mbit=100, server_mbit=100)
    assert got["cpu_busy"] == pytest.approx(0.5, abs=1e-3)  # 1 core-second per second of 2 cores
    assert got["busiest_process"] == "phub server" and got["busiest_process_cpu"] == pytest.approx(0.7, abs=1e-3)
    assert got["service_cpu"] == pytest.approx(0.7, abs=1e-3)
    assert got["processes_cpu"] == pytest.approx(0.3 + 0.15 + 0.7, abs=1e-3)  # both workers and the server
    assert got["link_utilization"] == pytest.approx(5e6 * 8 / 100e6, abs=1e-3)  # the busiest direction: worker rx
    # the server used 0.7 of a core while its links ran at 40%: nothing ran full, and without a
    # compute floor nothing else set the pace either
    assert got["bound"] == "other"


def test_the_time_the_hypervisor_took_comes_out_beside_the_busy_time_it_is_part_of():
    got = summarize(_samples(busy_per_s=1.5, steal_per_s=0.3), _ranks(), cores=2)
    assert got["cpu_steal"] == pytest.approx(0.15, abs=1e-3)  # 0.3 core-seconds per second of 2 cores
    assert got["cpu_busy"] == pytest.approx(0.75, abs=1e-3)  # still counted busy: the run could not have it
    no_steal = _samples()
    for sample in no_steal:
        sample.steal = None  # samples that did not read it (an older run's)
    assert summarize(no_steal, _ranks(), cores=2)["cpu_steal"] is None


def test_this_machine_reports_its_stolen_time_within_its_busy_time():
    busy, stolen = machine_cpu()
    assert 0 <= stolen <= busy
    with Stolen() as block_of:
        sum(range(200_000))
    assert 0 <= block_of.share <= 1


def test_a_timing_says_when_the_hypervisor_took_the_cores():
    assert stolen_words(0.12) == " (the hypervisor took 12%)"
    assert stolen_words(0.01) == stolen_words(None) == ""  # too little to matter, or not known
    assert median_share([0.1, None, 0.3, 0.2]) == 0.2 and median_share([None]) is None


def test_tcp_losses_are_counted_between_the_samples_around_the_window_on_emulated_links_only():
    # samples every 0.5 s, window [1.2, 2.7]: counted from the sample at 1.0 to the one at 3.0
    samples = _samples(timeouts_at=(0.9, 1.1, 2.9, 3.2))
    got = summarize(samples, _ranks(start=1.2, end=2.7), cores=2, host_mbit=100)
    assert (got["tcp_retransmits"], got["tcp_timeouts"]) == (20, 2)
    assert summarize(samples, _ranks(start=1.0, end=2.5), cores=2, host_mbit=100)["tcp_timeouts"] == 1
    # on loopback the counters are the host's, not the run's: none are given
    got = summarize(samples, _ranks(start=1.2, end=2.7), cores=2)
    assert got["tcp_retransmits"] is None and got["tcp_timeouts"] is None


def test_tcp_losses_are_read_from_this_process_namespace():
    from experiments.monitor import _tcp_losses

    resent, timeouts = _tcp_losses(os.getpid())
    assert resent >= 0 and timeouts >= 0
    assert _tcp_losses(2 ** 22 + 1) is None  # no such process


def test_oracle_checks_are_taken_out_of_the_cpu_figures():
    # 1 s of the 2 s window was checking, at 1 core: the cores' and rank 0's figures drop by it
    got = summarize(_samples(busy_per_s=1.5, worker_cpu=0.9, server_cpu=0.6), _ranks(paused=0.5, verify_cpu=1.0),
                    cores=2)
    assert got["timed_seconds"] == pytest.approx(1.5)
    assert got["cpu_busy"] == pytest.approx((1.5 * 2 - 1.0) / (2 * 1.5), abs=1e-3)
    assert got["busiest_process_cpu"] == pytest.approx(max(0.6 * 2, 0.9 * 2 - 1.0) / 1.5, abs=1e-3)


@pytest.mark.parametrize("cpu, busiest, link, over_compute, bound", [
    (0.3, 0.2, 0.5, None, "other"),  # nothing ran full: latency, stalls or the protocol set the pace
    (0.7, 0.2, 0.84, None, "other"),  # a link just under LINK_FULL is not the bottleneck
    (0.3, 0.2, 0.85, None, "wire"), (0.7, 0.4, 0.9, 1.5, "wire"),  # the link ran full
    (0.3, 0.9, None, None, "cpu"), (0.9, 0.2, 0.5, None, "cpu"),  # one process, or all the cores
    (0.9, 0.2, 0.95, None, "wire"),  # saturated cores beside a full link: the link set the pace
    (0.9, 0.9, 0.3, 1.1, "compute"), (0.2, 0.2, 0.3, 1.05, "compute"),  # within NEAR_FLOOR of the compute
    (0.2, 0.2, 0.3, 1.11, "other"),
])
def test_classify(cpu, busiest, link, over_compute, bound):
    assert classify(cpu, busiest, link, over_compute) == bound


def test_a_run_over_its_floors_is_judged_against_them():
    figures = {"cpu_busy": 0.3, "busiest_process_cpu": 0.2, "link_utilization": 0.9, "timed_seconds": 4.0,
               "bound": "other"}
    # 4 iterations of 1.0 s: the link carried 0.9 s of bytes per iteration at its rate
    got = settle(figures, 1.0, 0.5, 4)
    assert got["wire_floor_seconds"] == pytest.approx(0.9) and got["compute_floor_seconds"] == 0.5
    assert got["floor_seconds"] == pytest.approx(0.9) and got["over_floor"] == pytest.approx(1.0 / 0.9, abs=1e-4)
    assert got["bound"] == "wire"
    assert settle(dict(figures, link_utilization=0.2), 0.52, 0.5, 4)["bound"] == "compute"
    slow = settle(dict(figures, link_utilization=0.2), 2.0, 0.5, 4)
    assert slow["floor_seconds"] == 0.5 and slow["over_floor"] == 4.0 and slow["bound"] == "other"
    assert settle({}, 1.0, 0.5, 4) == {}  # no samples over the window: nothing to judge
    no_link = floors(1.0, None, None)
    assert no_link["floor_seconds"] is None and no_link["over_floor"] is None


def test_workers_timed_in_spans_that_do_not_overlap_still_get_a_bound():
    # a block of two 30 ms iterations, the workers 40 ms apart and 10 ms of checks: the common
    # span leaves 10 ms, too short a base, so the figures come from the span in which any was
    ranks = [{"rank": 0, "pid": 11, "window": (1.00, 1.06), "paused": 0.01, "verify_cpu": 0.0},
             {"rank": 1, "pid": 12, "window": (1.04, 1.10), "paused": 0.0, "verify_cpu": 0.0}]
    got = summarize(_samples(server_cpu=0.3), ranks, cores=2)
    assert got["timed_seconds"] == pytest.approx(0.09)
    assert got["cpu_busy"] == pytest.approx(0.5 * 0.1 / 0.09, abs=1e-3) and got["bound"] == "other"
    ranks[1]["window"] = (1.07, 1.13)  # no common span at all
    assert summarize(_samples(), ranks, cores=2)["timed_seconds"] == pytest.approx(0.12)


def test_a_window_the_samples_do_not_cover_gives_nothing():
    assert summarize(_samples(seconds=2.0), _ranks(start=1.0, end=3.0), cores=2) == {}
    assert summarize([], _ranks(), cores=2) == {}
    assert summarize(_samples(), [{"rank": 0, "pid": 11, "window": None}], cores=2) == {}


def test_blocks_cut_the_stamps_of_each_rank():
    ranks = [{"rank": 0, "pid": 5, "stamps": [0, 1, 2, 3, 4], "checks": [[0.1, 0.05]] * 4}]
    (view,) = block(ranks, 2, 2)
    assert view["window"] == (2, 4) and view["paused"] == pytest.approx(0.2) and view["verify_cpu"] == pytest.approx(0.1)
    (short,) = block(ranks, 3, 2)
    assert short["window"] is None


def test_the_monitor_sees_its_own_children_burn_cpu():
    import subprocess
    import sys

    with Monitor(period=0.05) as monitor:
        # the child spins until it has used 0.6 s of CPU (not of wall time: the machine may be busy)
        child = subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 0.6: pass"])
    assert child.returncode == 0
    used = max(cpu for s in monitor.samples for pid, (cpu, name) in s.procs.items())
    assert used >= 0.3 and len(monitor.samples) >= 5
    assert all(s.busy >= 0 for s in monitor.samples) and os.getpid() not in monitor.samples[-1].procs


def test_a_worker_can_wait_for_a_sample_that_sees_it_alive_past_its_window(tmp_path):
    """The last block's figures need a sample after its end with the worker still alive."""
    import subprocess
    import sys

    clock = str(tmp_path / "monitor.clock")
    code = ("import sys, time\nfrom experiments.monitor import wait_for_sample\n"
            "end = time.monotonic()\nprint(wait_for_sample(sys.argv[1], end), repr(end))")
    with Monitor(period=0.05, clock_file=clock) as monitor:
        child = subprocess.Popen([sys.executable, "-c", code, clock], stdout=subprocess.PIPE, text=True,
                                 cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out, _ = child.communicate(timeout=30)
    waited, end = out.split()
    assert waited == "True"
    assert any(s.t >= float(end) and child.pid in s.procs for s in monitor.samples)


def test_without_a_monitor_there_is_nothing_to_wait_for(tmp_path):
    from experiments.monitor import wait_for_sample

    assert wait_for_sample(str(tmp_path / "absent.clock"), 0.0, timeout=60) is False
    assert wait_for_sample(None, 0.0) is False


def test_a_racks_uplink_to_the_core_can_be_the_busiest_link():
    samples = _samples(link_bytes_per_s=1e6)
    for s in samples:  # rack 0's uplink carried 10 MB/s towards the core, read in the switch namespace
        s.links["switch/up0"] = (0, int(1e7 * s.t))
        s.links["switch/dn0"] = (int(1e7 * s.t), 0)  # the same bytes at the core's end: not counted twice
    got = summarize(samples, _ranks(), cores=2, host_mbit=100, server_mbit=100, uplink_mbit=100)
    assert got["link_utilization"] == pytest.approx(1e7 * 8 / 100e6, abs=1e-3)
    # without the uplinks' rate (one rack: no uplinks) the workers' links are the busiest
    assert summarize(samples, _ranks(), cores=2, host_mbit=100)["link_utilization"] == pytest.approx(0.08, abs=1e-3)


@pytest.mark.skipif(os.geteuid() != 0, reason="entering a network namespace needs root")
def test_the_monitor_reads_the_counters_of_a_namespace_no_process_lives_in():
    import subprocess
    import sys

    from experiments.rack.netns import run

    switch, peer = f"phub-mon{os.getpid()}-sw", f"phub-mon{os.getpid()}-peer"
    run(["ip", "netns", "add", switch])
    run(["ip", "netns", "add", peer])
    try:
        run(["ip", "-n", switch, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", peer])
        for ns, iface, address in ((switch, "up0", "198.18.250.1/30"), (peer, "eth0", "198.18.250.2/30")):
            run(["ip", "-n", ns, "addr", "add", address, "dev", iface])
            run(["ip", "-n", ns, "link", "set", iface, "up"])
        send = ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                "for _ in range(200): s.sendto(bytes(1000), ('198.18.250.1', 9))")
        with Monitor(period=0.05, switch_ns=switch) as monitor:
            subprocess.run(["ip", "netns", "exec", peer, sys.executable, "-c", send], check=True, timeout=30)
        # the namespaces are new, so the counters started near 0; stopping took a last sample
        received = [s.links["switch/up0"][0] for s in monitor.samples if "switch/up0" in s.links]
        assert received and received[-1] >= 200 * 1000
    finally:
        run(["ip", "netns", "del", peer])
        run(["ip", "netns", "del", switch])
