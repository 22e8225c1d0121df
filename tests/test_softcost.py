"""The software-cost experiment (experiments.softcost): its arithmetic on made-up layouts and
samples, and one real run of phub and stock MXNet whose rows must hold together."""
import math
import os

import pytest

from experiments import softcost, softcost_run
from experiments.layouts import Array
from experiments.models import Layer, Model, load_model


def _model(*elements):
    arrays = tuple(Array(f"a{i}", (n,), 0.0) for i, n in enumerate(elements))
    return Model("made-up", arrays, (Layer("all", tuple(range(len(arrays))), 0.0),), 0.0, None)


def test_phub_sends_every_chunk_once_and_gets_it_back():
    model = _model(250_000)  # 1,000,000 bytes: 30 chunks of 32 KB and one of 16,960
    flows = softcost.traffic(model, "phub", 2, 1, softcost.Setting("chunk32k", chunk_bytes=32768))
    worker = flows["worker_io"]
    assert (worker.bytes, worker.messages, worker.data_messages) == (2 * 2 * 1_000_000, 2 * 2 * 31, 2 * 2 * 31)
    assert worker.message_bytes == 32768 and flows["server"] == worker == flows["worker_framework"]


def test_pslite_splits_only_big_arrays_and_counts_acks_and_pull_requests():
    model = _model(2_000_000, 10, 500)
    two = softcost.traffic(model, "pslite-shard", 2, 2, softcost.Setting("bound1m", bigarray_bound=1_000_000))
    # parts per worker: 2 (the big array over both servers) + 1 + 1; four messages each, two with data
    assert two["worker_io"].messages == 2 * 4 * 4 and two["worker_io"].data_messages == 2 * 2 * 4
    assert two["worker_io"].bytes == 2 * 2 * 4 * 2_000_510
    one = softcost.traffic(model, "pslite-central", 2, 1, softcost.Setting("bound1m", bigarray_bound=1_000_000))
    assert one["server"].messages == 2 * 4 * 3  # one server: nothing is split
    small = softcost.traffic(model, "pslite-shard", 2, 2, softcost.Setting("bound1k", bigarray_bound=100))
    assert small["worker_io"].messages == 2 * 4 * 5  # the 500-element array is split too


def test_gloo_ring_sends_the_whole_buffer_in_segments_of_at_most_one_mib():
    total = 8 * 1024 * 1024 + 4096
    sends = softcost.gloo_segments(total, 2)
    assert len(sends) == 10 and max(sends) <= softcost.GLOO_MAX_SEGMENT_BYTES  # ceil to 9, rounded up to 10
    assert sum(sends) == total  # with two ranks, each sends half in each phase
    assert softcost.gloo_segments(400, 2) == [100, 100, 100, 100]  # at least two segments per rank
    flows = softcost.traffic(_model(total // 4), "gloo-ring", 2, 0, softcost.Setting("segment1m"))
    assert flows["server"].bytes == 0 and flows["worker_io"].messages == 2 * 2 * 10


@pytest.mark.parametrize("system, is_worker, is_main, name, blocked, role", [
    ("phub", False, True, "python", {"7": 3}, "server"),
    ("pslite-shard", False, False, "python", {"202": 3}, "server"),
    ("phub", True, True, "python", {"232": 9}, "worker_framework"),
    ("phub", True, False, "python", {"running": 9}, "worker_io"),
    ("gloo-ring", True, False, "gloo_tcp_loop", {"232": 1}, "worker_io"),
    ("gloo-ring", True, False, "pt_gloo_runloop", {"202": 5}, "worker_io"),
    ("gloo-ring", True, False, "python", {"202": 5}, "worker_framework"),
    ("pslite-shard", True, False, "python", {"232": 5, "running": 20}, "worker_io"),  # ZeroMQ's I/O thread
    ("pslite-shard", True, False, "python", {"7": 5, "202": 1}, "worker_io"),  # ps-lite's receiving thread
    ("pslite-central", True, False, "python", {"202": 5, "7": 1}, "worker_framework"),  # an engine thread
    ("pslite-central", True, False, "python", {"running": 5}, "worker_framework"),
])
def test_each_thread_gets_its_role(system, is_worker, is_main, name, blocked, role):
    assert softcost.thread_role(system, is_worker, is_main, name, blocked) == role


def _trace(pid, tid, worker, rate, start=0.0, stop=10.0, name="python", blocked=None):
    """A thread alive from `start` to `stop` using `rate` cores, sampled every 0.5 s."""
    points = [(start + 0.5 * i, 0.5 * i * rate) for i in range(int((stop - start) / 0.5) + 1)]
    return softcost.ThreadTrace(pid, tid, name, worker, points, softcost.Counter(blocked or {}))


def test_cpu_by_role_cuts_each_thread_to_the_window():
    traces = [_trace(10, 10, False, 0.8), _trace(11, 11, False, 0.0),  # a server and an idle scheduler
              _trace(20, 20, True, 0.2), _trace(20, 21, True, 0.5),  # worker 20: main and I/O thread
              _trace(30, 30, True, 0.3), _trace(30, 31, True, 0.4, start=3.0),  # I/O thread born in the window
              _trace(30, 32, True, 0.1, stop=4.0)]  # a helper thread that exits in the window
    got = softcost.cpu_by_role(traces, "phub", (2.25, 6.25))
    assert got["server"] == (pytest.approx(4 * 0.8), 1)
    assert got["worker_framework"] == (pytest.approx(4 * (0.2 + 0.3)), 2)
    io = 4 * 0.5 + (6.25 - 3.0) * 0.4 + (4.0 - 2.25) * 0.1
    assert got["worker_io"] == (pytest.approx(io), 3)


def test_cpu_at_interpolates_and_holds_past_the_ends():
    points = [(1.0, 0.0), (2.0, 1.0), (4.0, 2.0)]
    assert [softcost.cpu_at(points, t) for t in (0.5, 1.0, 1.5, 3.0, 9.0)] == [0.0, 0.0, 0.5, 1.5, 2.0]


def test_the_block_window_is_the_ranks_mean_and_needs_every_rank():
    assert softcost.block_window([[1.0, 5.0], [1.5, 5.5]]) == (1.25, 5.25)
    with pytest.raises(ValueError, match="no window"):
        softcost.block_window([[1.0, 5.0], None])


@pytest.mark.parametrize("symbol, dso, category", [
    ("mxnet::op::NAGMomUpdate<mshadow::cpu>", "/x/mxnet/libmxnet.so", "optimizer"),
    ("mxnet::ndarray::BinaryOpKernelLaunch<mxnet::ndarray::Plus, mshadow::cpu>", "/x/libmxnet.so", "aggregation"),
    ("mxnet::CopyFromTo", "/x/libmxnet.so", "copies"),
    ("zmq::epoll_t::loop", "/x/libmxnet.so", "network_stack"),
    ("mxnet::engine::ThreadedEngine::ExecuteOprBlock", "/x/libmxnet.so", "synchronization"),
    ("__memmove_avx_unaligned_erms", "/usr/lib/libc.so.6", "copies"),
    ("pthread_mutex_lock@@GLIBC_2.2.5", "/usr/lib/libc.so.6", "synchronization"),
    ("finish_round_of", "/x/phub/_fastpath.cpython-311-x86_64-linux-gnu.so", "optimizer"),
    ("fp_send_queued", "/x/phub/_fastpath.cpython-311-x86_64-linux-gnu.so", "network_stack"),
    ("_copy_from_iter", "[kernel.kallsyms]", "network_stack"),
    ("tcp_wmem_schedule", "[kernel.kallsyms]", "network_stack"),
    ("finish_task_switch.isra.0", "[kernel.kallsyms]", "synchronization"),
    ("clear_page_erms", "[kernel.kallsyms]", "rest"),
    ("_PyEval_EvalFrameDefault", "/usr/lib/libpython3.11.so.1.0", "rest"),
])
def test_perf_samples_fall_in_the_papers_categories(symbol, dso, category):
    assert softcost.category_of(symbol, dso) == category


def test_breakdown_counts_the_runs_samples_inside_the_window_only():
    lines = [" 10/10  5.000100:  7f00 mxnet::op::NAGMomUpdate<mshadow::cpu> (/x/libmxnet.so)",
             " 10/12  5.500000:  7f00 __memmove_avx_unaligned_erms (/usr/lib/libc.so.6)",
             " 10/12  5.600000:  7f00 __memmove_avx_unaligned_erms (/usr/lib/libc.so.6)",
             " 99/99  5.500000:  7f00 __memmove_avx_unaligned_erms (/usr/lib/libc.so.6)",  # not the run's
             " 10/10  9.000000:  7f00 mxnet::op::NAGMomUpdate<mshadow::cpu> (/x/libmxnet.so)",  # after the window
             "garbage line"]
    got = softcost.breakdown(lines, {10}, (5.0, 6.0), 0.001)
    assert got == {"copies": 0.002, "aggregation": 0.0, "optimizer": 0.001, "synchronization": 0.0,
                   "network_stack": 0.0, "rest": 0.0}


def test_the_busiest_threads_share_is_per_process_and_role():
    traces = [_trace(10, 10, False, 0.6), _trace(10, 12, False, 0.2),  # a server: 0.6 of its 0.8 on one thread
              _trace(20, 20, True, 0.2), _trace(20, 21, True, 0.5),  # worker 20: main and one I/O thread
              _trace(30, 30, True, 0.3), _trace(30, 31, True, 0.4), _trace(30, 32, True, 0.1)]  # two I/O threads
    got = softcost.busiest_thread_share(traces, "phub", (2.0, 6.0))
    assert got["server"] == pytest.approx(0.75)
    assert got["worker_framework"] == pytest.approx(1.0)  # the main thread, one per process
    assert got["worker_io"] == pytest.approx((0.5 + 0.4) / (0.5 + 0.4 + 0.1))
    idle = softcost.busiest_thread_share([_trace(10, 10, False, 0.0)], "phub", (2.0, 6.0))
    assert all(math.isnan(v) for v in idle.values())


def test_rows_carry_every_contract_column():
    model = _model(250_000)
    flows = softcost.traffic(model, "phub", 2, 1, softcost.Setting("chunk32k", chunk_bytes=32768))
    run = {"system": "phub", "model": "made-up", "workers": 2, "servers": 1, "cores": 1,
           "message_setting": "chunk32k", "compute_seconds_per_iteration": 0.1, "git_commit": "abc",
           "host": "h", "cpu_model": "c"}
    block = softcost.Block(0, 4, 0.05, (1.0, 1.2), 0.8, 0.01)
    rows = softcost.role_rows(run, block, {"server": (0.4, 1), "worker_io": (0.3, 2), "worker_framework": (0.1, 2)},
                              flows)
    rows += softcost.breakdown_rows(run, block, dict.fromkeys(softcost.CATEGORIES, 0.1), 3, flows)
    assert len(rows) == 3 + len(softcost.CATEGORIES)
    for row in rows:
        assert set(row) == set(softcost.COLUMNS)
    assert [r["cpu_seconds_per_exchange"] for r in rows[:3]] == [0.1, 0.075, 0.025]
    assert rows[0]["monitor_cpu_seconds_per_exchange"] == 0.2


def test_iterations_cover_the_block_bytes():
    assert softcost.iterations_for(_model(250_000), 10e6) == 10
    assert softcost.iterations_for(_model(250_000), 1) == 1


# The real run: processes on loopback, perf where it may sample everything (root here).
CONSISTENT = 0.2  # per-role CPU summed vs the runner's monitor over the same block: within 20%


@pytest.mark.parametrize("system, setting", [("phub", softcost.Setting("chunk32k", chunk_bytes=32768)),
                                             ("pslite-shard", softcost.Setting("bound1m", bigarray_bound=10**6))])
def test_a_real_run_gives_consistent_rows(system, setting):
    with_perf = softcost_run.perf_usable() is None
    roles, parts = softcost_run.measure(system, "resnet18", setting, workers=2, repeats=1,
                                        block_bytes=4 * load_model("resnet18").bytes, with_perf=with_perf,
                                        time_limit=60)
    assert [r["role"] for r in roles] == list(softcost.ROLES)
    for row in roles + parts:
        assert set(softcost.COLUMNS) <= set(row)
        assert row["experiment"] == "software_cost" and row["model"] == "resnet18" and row["workers"] == 2
    by_role = {r["role"]: r for r in roles}
    assert all(by_role[role]["cpu_seconds_per_exchange"] > 0 for role in softcost.ROLES)
    assert by_role["server"]["processes"] >= 1 and by_role["worker_framework"]["processes"] == 2
    assert all(0 < by_role[role]["busiest_thread_share"] <= 1 for role in softcost.ROLES)
    if system == "phub":  # its framework is the main thread alone (MXNet's engine threads count there too)
        assert by_role["worker_framework"]["busiest_thread_share"] == 1
    total = sum(r["cpu_seconds_per_exchange"] for r in roles)
    monitor = roles[0]["monitor_cpu_seconds_per_exchange"]
    assert math.isclose(total, monitor, rel_tol=CONSISTENT), (total, monitor)
    if with_perf:
        assert [r["category"] for r in parts] == list(softcost.CATEGORIES)
        sampled = sum(r["cpu_seconds_per_exchange"] for r in parts)
        assert math.isclose(sampled, total, rel_tol=CONSISTENT), (sampled, total)
        core = "optimizer" if system == "phub" else "aggregation"
        assert {r["category"]: r for r in parts}[core]["cpu_seconds_per_exchange"] > 0
    else:
        assert parts == [] and os.geteuid() != 0


def test_the_figure_and_the_report_lines_from_made_up_rows(tmp_path, monkeypatch):
    from analysis import figures, plotting, reference, results
    from analysis.fig_softcost import non_compute_over_compute, report_lines, tables
    from experiments.fileio import write_csv

    flows = softcost.traffic(_model(250_000), "phub", 2, 1, softcost.Setting("chunk32k", chunk_bytes=32768))
    block = softcost.Block(0, 2, 0.5, (1.0, 2.0), 1.0, 0.0)
    for system, setting, each in (("pslite-shard", "bound1m", 0.1), ("phub", "chunk32k", 0.01)):
        run = {"system": system, "model": "googlenet", "workers": 2, "servers": 2, "cores": "",
               "message_setting": setting, "compute_seconds_per_iteration": 0.1, "git_commit": "abc",
               "host": "h", "cpu_model": "c"}
        roles = softcost.role_rows(run, block, dict.fromkeys(softcost.ROLES, (2 * each, 1)), flows)
        parts = softcost.breakdown_rows(run, block, dict.fromkeys(softcost.CATEGORIES, 2 * each), 4, flows)
        write_csv(tmp_path / "points" / "software_cost" / f"{system}.csv", roles, softcost.COLUMNS)
        write_csv(tmp_path / "points" / "software_cost" / f"{system}-breakdown.csv", parts, softcost.COLUMNS)
    loaded = results.load(tmp_path / "points")
    assert len(loaded.software_cost) == 2 * (3 + 6) and loaded.runs.empty
    breakdown, roles = tables(loaded.software_cost, reference.load())
    sums = non_compute_over_compute(breakdown)
    assert sums.loc["googlenet", "ours-stock"] == pytest.approx(6 * 0.1 / 0.1)  # six categories of 0.1 s
    assert sums.loc["googlenet", "paper-stock"] == pytest.approx(1.6)  # (0.08 + 0.08) / 0.10, the chart's
    assert sums.loc["resnet269", "paper-stock"] == pytest.approx(3.49, abs=0.01)
    text = "\n".join(report_lines(loaded.software_cost, reference.load()))
    assert "| googlenet | 1.60 | 6.00 | 0.09 | 0.60 |" in text
    assert "| pslite-shard | googlenet | bound1m | 100 | 100 | 100 | 3.00 |" in text
    monkeypatch.setattr(plotting, "DPI", 50)  # the same drawing, a faster test
    png = figures.render("software_cost", loaded, tmp_path / "figures")
    assert png.read_bytes().startswith(b"\x89PNG") and "2 runs" in (tmp_path / "figures" / "software_cost.rst").read_text()
    empty = results.Results(results.empty_runs())
    assert figures.render("software_cost", empty, tmp_path / "empty").is_file()
    assert report_lines(empty.software_cost, reference.load()) == ["The software-cost experiment has no rows in this run."]


@pytest.mark.parametrize("kwargs, words", [({"systems": ["nope"]}, "unknown system 'nope'"),
                                           ({"models": ["nope"]}, "unknown model 'nope'"),
                                           ({"workers": 1}, "at least 2 workers")])
def test_bad_settings_are_refused_before_anything_runs(tmp_path, kwargs, words):
    from phub.errors import ConfigError

    settings = dict({"systems": ["phub"], "models": ["googlenet"]}, **kwargs)
    with pytest.raises(ConfigError, match=words):
        softcost_run.run_experiment(str(tmp_path), **settings)
    assert not list(tmp_path.iterdir())
