"""The model's measured run-queue wait: the software-cost rows record each role's wait for a core
(schedstat's 2nd field), and the replay of a point that has it runs each role's threads that much
slower instead of simulating the shared cores. Rows without it keep the shared-cores replay."""
import pandas as pd
import pytest

from analysis.model import calibrate as fitting
from analysis.model.replay import Costs, Job, Machine, RoleCosts, simulate
from analysis.model.validate import measured_stretch, predict_softcost
from experiments import softcost

ROLES = ("server", "worker_io", "worker_framework")


def _one_layer_job(workers=1):
    # 10 chunks of 1 KB, no compute, one layer group: the exchange is CPU only
    return Job(system="phub", layers=(((10 * 256,), 0.0, 0.0),), workers=workers, chunk_bytes=1024, groups=1,
               piece_seconds=1e9)


def test_a_roles_stretch_lengthens_only_that_roles_work():
    job, costs = _one_layer_job(), RoleCosts(server=Costs(per_message=1e-3))
    plain = simulate(job, Machine(link_bytes_per_s=None), costs)
    assert plain == pytest.approx(2 * 10 * 1e-3)  # the server receives and answers each chunk
    assert simulate(job, Machine(link_bytes_per_s=None, stretch=(("server", 2.0),)), costs) == pytest.approx(2 * plain)
    # a stretch of a role that costs nothing moves nothing
    assert simulate(job, Machine(link_bytes_per_s=None, stretch=(("worker_io", 3.0),)), costs) == pytest.approx(plain)


def test_a_measured_stretch_replaces_the_simulated_shared_core():
    # On one shared core every role's work queues behind the others'; with a measured stretch
    # no core is simulated, so the same job with a stretch of 1 runs its roles in parallel.
    job = _one_layer_job(workers=2)
    costs = RoleCosts(server=Costs(per_message=1e-3), worker_io=Costs(per_message=1e-3))
    one_core = simulate(job, Machine(link_bytes_per_s=None, shared_cores=1), costs)
    unlimited = simulate(job, Machine(link_bytes_per_s=None, shared_cores=1, stretch=(("server", 1.0),)), costs)
    assert unlimited < one_core


def _rows(wait=None, seconds=0.1):
    """One software-cost point (phub, googlenet, 32 KB chunks, 2 workers), two repeats."""
    layout = {"server": 0.04, "worker_io": 0.03, "worker_framework": 0.01}
    rows = []
    for repeat in range(2):
        for role, cpu in layout.items():
            row = {"experiment": "software_cost", "system": "phub", "model": "googlenet", "workers": 2, "cores": 1,
                   "message_setting": "chunk32k", "role": role, "cpu_seconds_per_exchange": cpu,
                   "bytes_per_exchange": 111976832, "messages_per_exchange": 3720, "seconds_per_iteration": seconds,
                   "repeat": repeat}
            if wait is not None:
                row["wait_seconds_per_exchange"] = wait * cpu
            rows.append(row)
    return pd.DataFrame(rows)


def test_rows_without_a_wait_column_load_and_keep_the_shared_core_replay(tmp_path):
    old = _rows()
    (tmp_path / "software_cost").mkdir()
    old.to_csv(tmp_path / "software_cost" / "phub-googlenet-chunk32k.csv", index=False)
    loaded = fitting.load_softcost(tmp_path)
    assert fitting.role_points(loaded)["wait"].isna().all()
    assert measured_stretch(fitting.role_points(loaded)) == {}
    points = predict_softcost(loaded, fitting.fit(loaded))
    assert not points["measured_wait"].any() and points["cores"].iloc[0] >= 1


def test_a_measured_wait_moves_the_prediction_up_by_the_waits_share():
    fitted = fitting.fit(_rows())
    none = predict_softcost(_rows(wait=0.0), fitted)
    waited = predict_softcost(_rows(wait=1.0), fitted)  # every role waited as long as it ran
    assert none["measured_wait"].all() and waited["measured_wait"].all()
    assert waited["predicted"].iloc[0] == pytest.approx(2 * none["predicted"].iloc[0], rel=1e-9)
    stretch = dict(measured_stretch(fitting.role_points(_rows(wait=0.5)))[("phub", "googlenet", "chunk32k")])
    assert stretch == pytest.approx({"server": 1.5, "worker_io": 1.5, "worker_framework": 1.5})


def test_a_partly_recorded_wait_is_not_used():
    rows = _rows(wait=1.0)
    rows.loc[rows["role"] == "server", "wait_seconds_per_exchange"] = float("nan")
    assert measured_stretch(fitting.role_points(rows)) == {}


def test_the_wait_by_role_is_cut_to_the_window_like_the_cpu():
    def trace(tid, worker, name, cpu_rate, wait_rate):
        times = [float(t) for t in range(0, 11)]
        return softcost.ThreadTrace(100 + tid, 100 + tid if not worker else 200 + tid, name, worker,
                                    [(t, cpu_rate * t) for t in times], softcost.Counter({"running": 1}),
                                    [(t, wait_rate * t) for t in times])

    server = trace(1, False, "python", 0.5, 0.25)  # a server process's main thread
    old = softcost.ThreadTrace(300, 300, "python", False, [(0.0, 0.0), (10.0, 5.0)], softcost.Counter())
    waits = softcost.wait_by_role([server, old], "phub", (2.0, 6.0))
    assert waits["server"] == pytest.approx(0.25 * 4)  # the trace without wait samples adds nothing
    assert set(waits) == set(ROLES)
    run = {"system": "phub", "model": "googlenet", "workers": 2, "servers": 1, "cores": 1,
           "message_setting": "chunk32k", "compute_seconds_per_iteration": 0.1, "git_commit": "x", "host": "h",
           "cpu_model": "c"}
    block = softcost.Block(0, 4, 0.1, (2.0, 6.0), None, None)
    flows = {role: softcost.Traffic(1, 1, 1, 1) for role in ROLES}
    rows = softcost.role_rows(run, block, {role: (0.4, 1) for role in ROLES}, flows, waits)
    assert [r["wait_seconds_per_exchange"] for r in rows] == pytest.approx([0.25, 0.0, 0.0])
    assert all(r["wait_seconds_per_exchange"] == "" for r in softcost.role_rows(run, block, {
        role: (0.4, 1) for role in ROLES}, flows))


def test_the_section_says_how_many_software_cost_points_recorded_their_wait():
    from analysis.model.section import render
    from analysis.model.validate import error_summary

    fitted = fitting.fit(_rows())
    waited = predict_softcost(_rows(wait=1.0), fitted)
    text = render({}, pd.DataFrame(), waited, error_summary(waited), pd.DataFrame())
    assert "1 of 1 points record it" in text and "None of these rows" not in text
    unwaited = predict_softcost(_rows(), fitted)
    text = render({}, pd.DataFrame(), unwaited, error_summary(unwaited), pd.DataFrame())
    assert "None of these rows records the wait" in text


def test_the_loopback_cores_come_from_the_rows_machine_cores_not_the_workers():
    # 2 workers on a machine the rows say has 4 cores, jobs that kept 3.2 busy: 3 cores modelled
    # (capped at the machine's 4, not at the 2 workers nor this machine's 2).
    rows = _rows(seconds=(0.04 + 0.03 + 0.01) / 3.2)
    rows["machine_cores"] = 4
    assert fitting.machine_cores(rows, 2) == 4
    assert predict_softcost(rows, fitting.fit(rows))["cores"].iloc[0] == 3
    assert fitting.machine_cores(_rows(), 2) == 2  # older rows: the default
    assert predict_softcost(_rows(seconds=(0.04 + 0.03 + 0.01) / 3.2), fitting.fit(rows))["cores"].iloc[0] == 2
