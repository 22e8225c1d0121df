"""The calibrated model (analysis.model): the replay's closed-form cases, the cost fit on made-up
rows, its message counts against the software-cost experiment's, and the report section."""
import math

import pandas as pd
import pytest

from analysis.model import calibrate as fitting
from analysis.model.replay import PHUB_HEADER_BYTES, Costs, Iteration, Job, Machine, RoleCosts, simulate
from analysis.model.traffic import UNIT_SPLIT, exchange_counts
from analysis.model.scenarios import job_from_softcost, loopback_machine
from analysis.model.section import render
from analysis.model.validate import charged_cpu, error_summary, simulate_many
from experiments import softcost
from experiments.models import load_model

RATE = 1e6  # bytes per second
ONE_PIECE = 1e9  # piece_seconds so large that every message crosses a link in one piece


def _job(system="phub", elements=(1000,), forward=0.01, backward=0.02, **knobs):
    knobs.setdefault("piece_seconds", ONE_PIECE)
    return Job(system=system, layers=((tuple(elements), forward, backward),), **knobs)


def test_one_layer_one_link_takes_compute_plus_bytes_over_rate():
    # One worker, one chunk, a server with no link limit: up the worker's link and back down.
    job = _job(workers=1, chunk_bytes=32768)
    machine = Machine(link_bytes_per_s=RATE, server_link_bytes_per_s=math.inf)
    wire = 4000 + PHUB_HEADER_BYTES
    assert simulate(job, machine) == pytest.approx(0.03 + 2 * wire / RATE, rel=1e-12)


def test_two_links_in_series_add_up_for_one_message():
    job = _job(workers=1, interfaces=2)
    machine = Machine(link_bytes_per_s=RATE, server_link_bytes_per_s=4 * RATE)  # the PBox: 2 x 4 x RATE
    wire = 4000 + PHUB_HEADER_BYTES
    assert simulate(job, machine) == pytest.approx(0.03 + 2 * (wire / RATE + wire / (8 * RATE)), rel=1e-12)


def test_cpu_bound_exchange_is_messages_times_the_per_message_cost_on_one_core():
    # 10 chunks, no link limit, one core for everything: the server receives and sends each chunk.
    job = _job(elements=(10 * 256,), forward=0.0, backward=0.0, workers=1, chunk_bytes=1024, groups=1)
    costs = RoleCosts(server=Costs(per_message=1e-3))
    assert simulate(job, Machine(link_bytes_per_s=None, shared_cores=1), costs) == pytest.approx(2 * 10 * 1e-3)
    # Per-byte costs add bytes x cost, both ways.
    costs = RoleCosts(server=Costs(per_message=1e-3, per_byte=1e-7))
    expected = 2 * (10 * 1e-3 + 10 * 1024 * 1e-7)
    assert simulate(job, Machine(link_bytes_per_s=None, shared_cores=1), costs) == pytest.approx(expected)


def test_work_off_the_busiest_thread_overlaps_the_next_messages():
    # 10 chunks in 10 units, no links: the server receives and answers each, 1 ms of CPU a time.
    # On one thread that is 20 ms; with half of it on the process's other threads the server's
    # thread is busy 20 x 0.5 ms, and only the last answer's other half trails it.
    job = _job(elements=(10 * 256,), forward=0.0, backward=0.0, workers=1, chunk_bytes=1024, groups=10)
    machine = Machine(link_bytes_per_s=None)
    assert simulate(job, machine, RoleCosts(server=Costs(per_message=1e-3))) == pytest.approx(0.020)
    half = RoleCosts(server=Costs(per_message=1e-3, busiest_share=0.5))
    assert simulate(job, machine, half) == pytest.approx(0.0105)


def test_chunks_pipeline_through_four_hops():
    # n chunks in n units (groups = n): each crosses the worker's uplink, the PBox's downlink, its
    # uplink and the worker's downlink at equal rates; the last one is back after (n + 3) hops.
    n = 6
    job = _job(elements=(n * 256,), workers=1, chunk_bytes=1024, groups=n)
    hop = (1024 + PHUB_HEADER_BYTES) / RATE
    assert simulate(job, Machine(link_bytes_per_s=RATE)) == pytest.approx(0.03 + (n + 3) * hop, rel=1e-9)


def test_a_message_in_pieces_pipelines_over_two_links():
    job = _job(workers=1, piece_seconds=0.001)  # pieces of 1,000 bytes at RATE
    replay = Iteration(job, Machine(link_bytes_per_s=RATE), RoleCosts())
    done = replay.send(replay.workers[0], replay.servers[0], 10_000)
    replay.env.run(until=done)
    assert replay.env.now == pytest.approx(11 * 1000 / RATE)  # 10 pieces, one more hop for the last


def test_a_busy_link_is_shared_fairly_between_connections():
    # Two workers push 4,000 bytes each through the PBox's single 1x link: 8,000 bytes queued,
    # served in alternation; neither waits for the other's whole message.
    job = _job(workers=2, piece_seconds=0.001)
    replay = Iteration(job, Machine(link_bytes_per_s=RATE), RoleCosts())
    first = replay.send(replay.workers[0], replay.servers[0], 4000)
    second = replay.send(replay.workers[1], replay.servers[0], 4000)
    replay.env.run(until=replay.env.all_of([first, second]))
    assert replay.env.now == pytest.approx(9 * 1000 / RATE)
    assert first.processed and second.processed


def test_the_gradient_waits_for_the_last_backward_layer_and_overlaps_the_rest():
    # Two layers: the second's gradient leaves after its backward, during the first's backward.
    job = Job(system="phub", layers=(((250,), 0.0, 0.5), ((250,), 0.0, 0.5)), workers=1, groups=2,
              piece_seconds=ONE_PIECE)
    machine = Machine(link_bytes_per_s=RATE, server_link_bytes_per_s=math.inf)
    hop = (1000 + PHUB_HEADER_BYTES) / RATE
    assert simulate(job, machine) == pytest.approx(1.0 + 2 * hop, rel=1e-9)


@pytest.mark.parametrize("system, setting", [
    ("phub", softcost.Setting("chunk32k", chunk_bytes=32768)),
    ("pshard", softcost.Setting("chunk4k", chunk_bytes=4096)),
    ("pslite-shard", softcost.Setting("bound1k", bigarray_bound=1000)),
    ("pslite-central", softcost.Setting("bound1m", bigarray_bound=1000 * 1000)),
    ("gloo-ring", softcost.Setting("segment1m")),
])
def test_the_replay_charges_the_bytes_and_messages_the_software_cost_rows_count(system, setting):
    servers = {"phub": 1, "pslite-central": 1, "gloo-ring": 0}.get(system, 4)
    row = {"system": system, "model": "googlenet", "workers": 4, "servers": servers, "cores": 1,
           "message_setting": setting.label}
    counted = softcost.traffic(load_model("googlenet"), system, 4, servers, setting)
    for role, (nbytes, messages) in exchange_counts(job_from_softcost(row)).items():
        assert (nbytes, messages) == (counted[role].bytes, counted[role].messages), role


def _made_up_rows(truth):
    rows = []
    for system, settings in (("phub", ("chunk32k", "chunk4k")), ("pslite-shard", ("bound1m", "bound1k"))):
        for model in ("googlenet", "resnet18", "alexnet"):
            for setting in settings:
                base = {"experiment": "software_cost", "system": system, "model": model, "workers": 2,
                        "servers": 1 if system == "phub" else 2, "cores": 1, "message_setting": setting}
                counts = exchange_counts(job_from_softcost(base))
                for role, (nbytes, messages) in counts.items():
                    for repeat, noise in enumerate((0.99, 1.0, 1.01)):
                        rows.append(dict(base, role=role, cpu_seconds_per_exchange=noise * getattr(
                            truth[system], role).seconds(messages, nbytes), bytes_per_exchange=nbytes,
                            messages_per_exchange=messages, seconds_per_iteration=1.0, repeat=repeat))
    return pd.DataFrame(rows)


def test_the_fit_takes_each_roles_median_busiest_thread_share_and_one_without_it():
    costs = RoleCosts(Costs(3e-5, 2.5e-9), Costs(1e-5, 6e-10), Costs(5e-6, 8e-10))
    rows = _made_up_rows({"phub": costs, "pslite-shard": costs})
    assert all(c.busiest_share == 1.0 for c in vars(fitting.fit(rows)["pslite-shard"]).values())
    rows["busiest_thread_share"] = rows["role"].map({"server": 0.4, "worker_io": 0.7, "worker_framework": 1.0})
    fitted = fitting.fit(rows)["pslite-shard"]
    assert (fitted.server.busiest_share, fitted.worker_io.busiest_share) == pytest.approx((0.4, 0.7))


def test_the_fit_recovers_known_costs_from_made_up_rows():
    truth = {"phub": RoleCosts(Costs(4e-6, 3e-10), Costs(2e-6, 2e-10), Costs(1e-6, 1e-10)),
             "pslite-shard": RoleCosts(Costs(3e-5, 2.5e-9), Costs(1e-5, 6e-10), Costs(5e-6, 8e-10))}
    fitted = fitting.fit(_made_up_rows(truth))
    for system, costs in truth.items():
        for role in fitting.ROLES:
            got, want = getattr(fitted[system], role), getattr(costs, role)
            assert got.per_byte == pytest.approx(want.per_byte, rel=1e-6), (system, role)
            assert got.per_message == pytest.approx(want.per_message, rel=1e-6), (system, role)


def test_softcost_files_load_and_a_bad_value_names_its_file_and_column(tmp_path):
    rows = _made_up_rows({s: RoleCosts() for s in ("phub", "pslite-shard")})
    folder = tmp_path / "software_cost"
    folder.mkdir()
    rows.to_csv(folder / "good.csv", index=False)
    assert len(fitting.load_softcost(tmp_path)) == len(rows)
    bad = rows.copy()
    bad.loc[3, "bytes_per_exchange"] = "lots"
    bad.to_csv(folder / "bad.csv", index=False)
    with pytest.raises(fitting.SoftCostError, match=r"bad\.csv: column 'bytes_per_exchange', line 5"):
        fitting.load_softcost(tmp_path)


def test_the_section_shows_errors_per_regime_costs_and_predictions_beside_the_paper():
    points = pd.DataFrame([
        {"regime": "emulated", "experiment": "pbox", "system": "phub", "model": "alexnet", "workers": 8,
         "setting": "cloud10g", "seconds": 1.0, "predicted": 1.05, "error": 0.05},
        {"regime": "emulated", "experiment": "pbox", "system": "phub", "model": "vgg11", "workers": 8,
         "setting": "cloud10g", "seconds": 1.0, "predicted": 0.7, "error": -0.3},
        {"regime": "software_cost", "experiment": None, "system": "pslite-shard", "model": "alexnet",
         "workers": 8, "message_setting": "bound1m", "seconds": 2.0, "predicted": 2.1, "error": 0.05}])
    summary = error_summary(points[points["regime"] == "emulated"], points[points["regime"] == "software_cost"])
    phub = summary[(summary["regime"] == "emulated") & (summary["system"] == "phub")].iloc[0]
    assert (phub["median_abs_error"], phub["worst_abs_error"]) == pytest.approx((0.175, 0.3))
    costs = pd.DataFrame([{"system": "phub", "role": "server", "ns_per_byte": 0.3, "us_per_message": 4.0,
                           "busiest_share": 0.8, "points": 6, "settings": "chunk32k, chunk4k", "median_fit_error": 0.01,
                           "worst_fit_error": 0.02}])
    predictions = pd.DataFrame([{"quantity": "speedup over stock MXNet", "model": "alexnet", "network": "cloud10g",
                                 "system": "PHub", "paper": 3.3, "predicted": 2.9, "low": 2.5, "high": 3.1,
                                 "ratios": "0.5,1,2", "measured_emulated": 8.23}])
    text = render({}, costs, points, summary, predictions)
    assert "| emulated | phub | 2 | 18% | 30% | missed |" in text
    assert "| software_cost | pslite-shard | 1 | 5% | 5% | met |" in text
    assert "| phub | server | 0.300 | 4.0 | 80% | 6 | chunk32k, chunk4k | 1% / 2% |" in text
    assert "| speedup over stock MXNet | alexnet | cloud10g | PHub | 3.30 | 2.90 | 2.50 to 3.10 | 8.23 |" in text
    assert "ratios 0.5,1,2" in text
    empty = render({}, pd.DataFrame(), points, summary, pd.DataFrame())
    assert "No software-cost rows" in empty and "The paper's setup" not in empty


def _softcost_block(system, cpu_by_role, seconds, repeat=0):
    return [{"experiment": "software_cost", "system": system, "model": "googlenet", "workers": 2,
             "message_setting": "chunk32k", "role": role, "cpu_seconds_per_exchange": cpu,
             "bytes_per_exchange": 1.0, "messages_per_exchange": 1.0, "seconds_per_iteration": seconds,
             "repeat": repeat} for role, cpu in cpu_by_role.items()]


def test_cores_in_use_is_the_median_of_every_roles_cpu_over_wall_time():
    rows = (_softcost_block("phub", {"server": 0.3, "worker_io": 0.2, "worker_framework": 0.1}, 1.2)  # 0.5
            + _softcost_block("phub", {"server": 0.6, "worker_io": 0.4, "worker_framework": 0.2}, 1.0, 1)  # 1.2
            + _softcost_block("pshard", {"server": 1.0, "worker_io": 0.5, "worker_framework": 0.5}, 1.0))  # 2.0
    rows.append(dict(rows[0], role="breakdown", cpu_seconds_per_exchange=50.0))  # not a role: left out
    assert fitting.cores_in_use(pd.DataFrame(rows)) == pytest.approx(1.2)
    assert math.isnan(fitting.cores_in_use(pd.DataFrame(rows[:0])))


@pytest.mark.parametrize("cores, modelled", [(0.85, 1), (0.2, 1), (1.6, 2), (7.0, 2), (float("nan"), 2)])
def test_the_loopback_machine_gets_the_cores_kept_busy_as_a_whole_number_within_this_machine(cores, modelled):
    assert loopback_machine(cores).shared_cores == modelled
    assert loopback_machine(cores).link_bytes_per_s is None


def test_one_shared_core_serializes_every_role_so_the_time_is_the_charged_cpu():
    # No link limit, no compute: on one core the iteration takes exactly the CPU charged for it,
    # on two the worker's and the server's work overlap and it takes less.
    job = _job(elements=(10 * 256,), forward=0.0, backward=0.0, workers=2, chunk_bytes=1024, groups=1)
    costs = RoleCosts(server=Costs(per_message=1e-3), worker_io=Costs(per_message=2e-3),
                      worker_framework=Costs(per_message=5e-4))
    charged = charged_cpu(job, costs)
    assert charged == pytest.approx(2 * 2 * 10 * (1e-3 + 2e-3 + 5e-4))  # 2 workers, 10 chunks, each way
    assert simulate(job, Machine(link_bytes_per_s=None, shared_cores=1), costs) == pytest.approx(charged)
    assert simulate(job, Machine(link_bytes_per_s=None, shared_cores=2), costs) < charged


def test_simulate_many_replays_each_distinct_job_once_and_keeps_the_order():
    one = (_job(workers=1), Machine(link_bytes_per_s=RATE, server_link_bytes_per_s=math.inf), RoleCosts())
    two = (_job(workers=1, backward=0.05), one[1], RoleCosts())
    expected = [simulate(*one), simulate(*two)]
    assert simulate_many([one, two, one], processes=1) == [expected[0], expected[1], expected[0]]
    assert simulate_many([two, one], processes=2) == pytest.approx([expected[1], expected[0]], rel=1e-12)


def test_the_section_splits_the_loopback_error_into_the_fit_and_the_cores_kept_busy():
    points = pd.DataFrame([
        {"regime": "software_cost", "system": "phub", "model": "alexnet", "workers": 2, "message_setting": "chunk32k",
         "seconds": 2.0, "predicted": 1.0, "error": -0.5, "cpu_measured": 0.9, "cpu_charged": 1.0, "cores": 1},
        {"regime": "emulated", "experiment": "breakdown", "system": "phub", "model": "googlenet",
         "variant": "no_compute", "workers": 8, "setting": "ib56g", "seconds": 0.06, "predicted": 0.015,
         "error": -0.75, "wire_floor": 0.03,
         "cpu_measured": 0.105, "cpu_charged": 0.005, "cores": None, "messages": 4000}])
    summary = error_summary(points[points["regime"] == "emulated"], points[points["regime"] == "software_cost"])
    text = render({}, pd.DataFrame(), points, summary, pd.DataFrame())
    assert "| phub | 1 | 11% | 0.45 | 1 | 50% |" in text  # 1.0 / 0.9 - 1; 0.9 CPU-s over 2 s
    assert ("| breakdown | phub | googlenet | no_compute | 8 | ib56g | 0.060 | 0.015 | -75% | 2.00 | 0.105 | 0.005 "
            "| 25.0 |") in text
    assert "a median 0.45 cores" in text


def test_phub_sends_a_groups_chunks_back_in_finer_units_so_only_the_last_one_trails():
    # One layer of 4 chunks, one group: UNIT_SPLIT (4) units of one chunk each go up the worker's
    # link back to back; each comes down as soon as it is up, so only the last one's way down
    # adds to the 4 chunks' way up.
    assert UNIT_SPLIT == 4
    job = _job(elements=(4 * 8192,), workers=1, chunk_bytes=32768, groups=1)
    machine = Machine(link_bytes_per_s=RATE, server_link_bytes_per_s=math.inf)
    chunk = 32768 + PHUB_HEADER_BYTES
    assert simulate(job, machine) == pytest.approx(0.03 + 5 * chunk / RATE, rel=1e-12)


def test_the_rack_simulation_adds_its_trips_on_the_server_before_the_answer():
    # One worker, one chunk, one shared core, only the server costs: its receive, R trips of a
    # send and a receive each, its answer.
    job = _job(elements=(256,), forward=0.0, backward=0.0, workers=1, chunk_bytes=1024, groups=1,
               simulated_racks=3)
    costs = RoleCosts(server=Costs(per_message=1e-3))
    machine = Machine(link_bytes_per_s=None, shared_cores=1)
    assert simulate(job, machine, costs) == pytest.approx((2 + 2 * 3) * 1e-3)


@pytest.mark.parametrize("on_link, hops", [(False, 4), (True, 4 + 2 * 2)])
def test_the_rack_simulations_trips_cross_the_pbox_link_only_where_the_machine_says(on_link, hops):
    # Up the worker's link, down the PBox's; two trips out and back on the PBox's link where they
    # cross it; the answer up the PBox's link and down the worker's: one piece per hop, in series.
    job = _job(workers=1, simulated_racks=2)
    machine = Machine(link_bytes_per_s=RATE, server_link_bytes_per_s=RATE, trips_on_link=on_link)
    wire = 4000 + PHUB_HEADER_BYTES
    assert simulate(job, machine) == pytest.approx(0.03 + hops * wire / RATE, rel=1e-12)


def test_only_phub_simulates_racks():
    with pytest.raises(ValueError, match="simulated_racks"):
        _job(system="pshard", workers=2, simulated_racks=2)
    with pytest.raises(ValueError, match="simulated_racks"):
        _job(workers=1, simulated_racks=0)


def test_a_measurement_several_experiments_share_is_one_validation_point():
    from analysis.model.scenarios import median_points

    base = {"system": "phub", "model": "alexnet", "variant": "full", "network": "emulated", "racks": 1,
            "workers": 8, "interfaces": 8, "cores": 1, "chunk_bytes": 480, "link_gbps": 0.05,
            "link_gbps_measured": 0.048, "s_m": 373.3, "s_t": 3.0, "compute": "replay", "setting": "ib56g",
            "bound": "other", "seconds_per_iteration": 0.18, "measurement": "abc"}
    runs = pd.DataFrame([dict(base, experiment="pbox", point="ib56g-alexnet-phub"),
                         dict(base, experiment="cross_rack", point="sim-alexnet-r1", simulated_racks=1),
                         dict(base, experiment="cross_rack", point="sim-alexnet-r2", simulated_racks=2,
                              measurement="def", seconds_per_iteration=0.24)])
    points = median_points(runs)
    assert sorted(points["point"]) == ["ib56g-alexnet-phub", "sim-alexnet-r2"]
    assert points.set_index("point").loc["sim-alexnet-r2", "simulated_racks"] == 2


def _phub_softcost():
    rows = []
    for setting, messages in (("chunk32k", 100.0), ("chunk4k", 800.0)):
        for role, (per_byte, per_message) in {"server": (4e-10, 1e-6), "worker_io": (3e-10, 1e-6),
                                              "worker_framework": (0.0, 1e-7)}.items():
            nbytes = 3.2e6
            rows.append({"experiment": "software_cost", "system": "phub", "model": "alexnet", "workers": 2,
                         "message_setting": setting, "role": role, "repeat": 0, "seconds_per_iteration": 0.01,
                         "cpu_seconds_per_exchange": per_byte * nbytes + per_message * messages,
                         "bytes_per_exchange": nbytes, "messages_per_exchange": messages})
    return pd.DataFrame(rows)


def test_the_rack_rows_get_the_models_derived_overhead_beside_the_paper():
    from analysis.claims.rack import derived_overheads
    from analysis.model.validate import RACKS_QUANTITY, rack_simulation_predictions

    overheads = pd.DataFrame([{"model": "resnet50", "racks": 2, "overhead_pct": 0.4}])
    fitted = fitting.fit(_phub_softcost())
    rows = rack_simulation_predictions(fitted, overheads, ratios=(1.0,))
    row = rows.iloc[0]
    assert (row["quantity"], row["racks"], row["paper"]) == (RACKS_QUANTITY, 2, 0.4)
    assert 0 < row["worker_io_seconds"] and 0 < row["one_rack_seconds"]
    assert math.isfinite(row["predicted"]) and row["low"] <= row["predicted"] <= row["high"]
    words = derived_overheads(overheads, _phub_softcost())
    assert words[("resnet50", 2)].startswith("Derived, not measured: the calibrated model puts this at")
    assert derived_overheads(overheads, pd.DataFrame()) == {}


def test_two_racks_add_a_share_out_to_its_owner_and_its_total_back_between_push_and_answer():
    # One worker per rack, one chunk: push (2 hops), half the unit to its owner and the other
    # half's total back (PBox up, uplink up, the other uplink down, PBox down: 4 hops each at half
    # size), the answer (2 hops): 8 full hops in series, the racks' frames on disjoint links.
    job = _job(workers=2, racks=2)
    machine = Machine(link_bytes_per_s=RATE, server_link_bytes_per_s=RATE, uplink_bytes_per_s=RATE)
    wire = 4000 + PHUB_HEADER_BYTES
    assert simulate(job, machine) == pytest.approx(0.03 + 8 * wire / RATE, rel=1e-12)
    # The server's cost of each share, sent and received, twice (partial and total), on the path.
    costs = RoleCosts(server=Costs(per_message=1e-3))
    unlimited = Machine(link_bytes_per_s=None)
    assert simulate(job, unlimited, costs) == pytest.approx(0.03 + 2e-3 + 4 * 0.5e-3, rel=1e-12)


def test_racks_need_phub_and_the_same_workers_in_every_rack():
    with pytest.raises(ValueError, match="racks"):
        _job(workers=3, racks=2)
    with pytest.raises(ValueError, match="racks"):
        _job(system="pshard", workers=2, racks=2)
