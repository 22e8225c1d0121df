"""The one process supervisor (phub.launching.supervisor) and `run_job` with several jobs on one server.

Real processes throughout: small `python -c` programs whose exit status and output are known,
and, for the jobs, phub workers whose results after k SGD steps are known exactly."""
import io
import os
import sys
import time
from pathlib import Path

import pytest

from phub.config import JobSpec, ServerConfig
from phub.errors import ConfigError, PHubError
from phub.launching import launch
from phub.launching.launch import run_job
from phub.launching.supervisor import Supervisor, blame

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _exit(code: int, after_line: str = "") -> list:
    return [PY, "-c", f"import sys; print({after_line!r}, flush=True); sys.exit({code})"]


def test_blame_names_a_worker_killed_by_a_signal_before_those_that_exited_when_told():
    # rank 0 exits with an error because the server told it rank 1 was lost; rank 1 was killed
    assert blame([("rank 0", 1), ("rank 1", -9)]) == "rank 1 exited with status -9 (SIGKILL); rank 0 failed with it"
    # none killed: the first in start order
    assert blame([("rank 1", 3), ("rank 2", 1)]) == "rank 1 exited with status 3; rank 2 failed with it"
    assert blame([("rank 3", 1)]) == "rank 3 exited with status 1"


def test_output_is_pumped_line_by_line_with_each_process_prefix():
    output = io.StringIO()
    with Supervisor() as supervisor:
        supervisor.start("one", _exit(0, "hello"), output=output)
        supervisor.start("two", [PY, "-c", "import sys; print('to err', file=sys.stderr)"], output=output)
        assert supervisor.wait_workers(time_limit=60) is None
    assert supervisor.worker_status == {"one": 0, "two": 0}
    assert "[one] hello\n" in output.getvalue() and "[two] to err\n" in output.getvalue()


def test_a_failing_worker_is_named_and_the_rest_are_stopped():
    with Supervisor() as supervisor:
        sleeper = supervisor.start("sleeper", [PY, "-c", "import time; time.sleep(600)"])
        supervisor.start("quitter", _exit(7))
        assert supervisor.wait_workers(time_limit=60) == "quitter exited with status 7"
        assert supervisor.failed_service is None  # a worker's failure, not a service's
    assert sleeper.poll() is not None  # leaving the block stopped it


def test_a_service_that_fails_first_is_named_one_that_exits_zero_is_not():
    with Supervisor() as supervisor:
        supervisor.start("done early", _exit(0), service=True)
        supervisor.start("broken service", _exit(3), service=True)
        supervisor.start("worker", [PY, "-c", "import time; time.sleep(600)"])
        assert supervisor.wait_workers(time_limit=60) == "broken service failed (status 3) while the workers were running"
        assert supervisor.failed_service == "broken service"


def test_the_time_limit_and_a_check_end_the_wait_naming_why():
    with Supervisor() as supervisor:
        supervisor.start("slow", [PY, "-c", "import time; time.sleep(600)"])
        started = time.monotonic()
        failure = supervisor.wait_workers(time_limit=0.5)
        assert failure.startswith("the run did not finish within its time limit of 0.5 s; still running: slow")
        assert time.monotonic() - started < 30
        assert supervisor.wait_workers(check=lambda: "the check said so") == "the check said so"


def test_services_must_exit_cleanly_after_the_workers_and_run_raises_the_first_failure(tmp_path):
    # The service fails only once the worker has exited (a zombie or gone: its own poll has not
    # reaped it yet), so the failure can only be seen after the workers, as a service's exit.
    wait_then_fail = ("import sys, time\n"
                      "def alive(pid):\n"
                      "    try:\n"
                      "        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'\n"
                      "    except OSError:\n"
                      "        return False\n"
                      "while alive(int(sys.argv[1])): time.sleep(0.01)\n"
                      "sys.exit(2)")
    with Supervisor() as supervisor:
        worker = supervisor.start("worker", _exit(0))
        supervisor.start("service", [PY, "-c", wait_then_fail, str(worker.pid)], service=True)
        with pytest.raises(PHubError, match=r"service did not finish cleanly \(status 2\)"):
            supervisor.run(time_limit=60)
    with Supervisor() as supervisor:
        supervisor.start("lingering", [PY, "-c", "import time; time.sleep(600)"], service=True)
        supervisor.start("worker", _exit(0))
        assert supervisor.wait_workers(60) is None
        assert supervisor.wait_services(grace=0.2) == "lingering did not exit within 0.2 s after the workers"


# Each worker of job J pushes J + rank for STEPS SGD steps (learning rate 1) on weights that start
# at 0: every step subtracts the job's sum of pushes, so job J ends at -STEPS * (2J + 1).
WORKER = """
import os, numpy, phub
kv = phub.connect()
job, rank = int(os.environ["PHUB_JOB"]), kv.rank
w = numpy.zeros(5000, numpy.float32)
kv.init("w", w)
kv.set_optimizer(phub.SGD(learning_rate=1.0))
for _ in range({steps}):
    kv.pushpull("w", numpy.full(5000, job + rank, numpy.float32), out=w)
print("job", job, "rank", rank, "tag", os.environ["TAG"], "result", float(w.min()), float(w.max()), flush=True)
kv.close()
"""


def test_run_job_serves_two_jobs_on_one_server_each_with_its_own_ranks_and_environment(tmp_path):
    steps = 3
    config = ServerConfig(jobs=(JobSpec(1, 2, "one"), JobSpec(2, 2, "two")), cores=2, timeout=60)
    out = open(tmp_path / "out.txt", "w+")
    env = dict(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = run_job([PY, "-c", WORKER.format(steps=steps)], 4, config, extra_env=env, stdout=out, stderr=out,
                     job_env={1: {"TAG": "first"}, 2: {"TAG": "second"}}, time_limit=120)
    out.seek(0)
    text = out.read()
    assert result.status == 0, (result.failed, text)
    assert result.worker_status == {f"job {j} rank {r}": 0 for j in (1, 2) for r in (0, 1)}
    for job, tag in ((1, "first"), (2, "second")):
        expected = -steps * (2 * job + 1)
        for rank in (0, 1):
            line = f"[job {job} rank {rank}] job {job} rank {rank} tag {tag} result {expected:.1f} {expected:.1f}"
            assert line in text, text


def test_a_job_whose_joined_lines_never_arrive_still_succeeds_when_its_server_exits_cleanly(monkeypatch):
    # The server's `joined` lines are dropped: its clean exit (after every rank said BYE) must be
    # taken as proof that every rank connected, not a failure "exited without ever connecting".
    monkeypatch.setattr(launch._Joins, "read", lambda self, stream: stream.read())
    out = io.StringIO()
    config = ServerConfig(jobs=(JobSpec(1, 2),), timeout=60)
    env = dict(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), TAG="t")
    result = launch.run_job([PY, "-c", WORKER.format(steps=2)], 2, config, extra_env=env, stdout=out, stderr=out,
                            time_limit=120)
    assert result.status == 0, (result.failed, out.getvalue())
    assert "job 1 rank 1 tag t result -6.0 -6.0" in out.getvalue(), out.getvalue()


def test_run_job_with_two_jobs_names_the_job_of_the_worker_that_failed():
    config = ServerConfig(jobs=(JobSpec(1, 1), JobSpec(2, 1)), timeout=60)
    code = "import os, sys; sys.exit(5 if os.environ['PHUB_JOB'] == '2' else 0)"
    result = run_job([PY, "-c", code], 2, config, stdout=io.StringIO(), stderr=io.StringIO(), time_limit=60)
    assert result.status == 1 and result.failed.startswith("job 2 rank 0 on worker1 failed first (status 5)"), result.failed


def test_run_job_rejects_jobs_whose_workers_do_not_add_up():
    config = ServerConfig(jobs=(JobSpec(1, 2), JobSpec(2, 2)))
    with pytest.raises(ConfigError, match=r"have 4 workers, not 3"):
        run_job([PY, "-c", "pass"], 3, config)


# A worker that fails: rank FAIL raises where the script says, its teardown slow (as torch's
# can be: one second in an exit hook, run after phub has told the server), so that the processes
# that fail because of it (the others, the server) exit before it does.
FAILING = """
import atexit, os, time, numpy, phub
atexit.register(time.sleep, 1.0)
rank = int(os.environ["PHUB_RANK"])
if rank == {fail} and {before_connect}:
    raise RuntimeError("CUDA is not available")
kv = phub.connect()
w = numpy.zeros(10, numpy.float32)
kv.init("w", w)
if rank == {fail}:
    raise ValueError("bad batch size 0")
kv.pushpull("w", numpy.ones(10, numpy.float32), out=w)
"""


@pytest.mark.parametrize("workers, fail, before_connect, words", [
    (2, 1, False, "rank 1 on worker1 failed first (status 1): ValueError: bad batch size 0"),  # rank 0 exits first
    (1, 0, False, "rank 0 on worker0 failed first (status 1): ValueError: bad batch size 0"),  # the server first
    (2, 1, True, "rank 1 on worker1 failed first (status 1): RuntimeError: CUDA is not available"),
])
def test_the_launcher_names_the_first_process_that_failed_its_node_and_its_exception(workers, fail, before_connect,
                                                                                      words):
    """Not a rank that failed because of it, nor the server that failed the job: the server
    reports which worker ended the job, and the launcher gives that worker's last line."""
    out = io.StringIO()
    env = dict(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = run_job([PY, "-c", FAILING.format(fail=fail, before_connect=before_connect)], workers,
                     ServerConfig(timeout=60), extra_env=env, stdout=out, stderr=out, time_limit=60)
    assert result.status == 1 and result.failed == words, (result.failed, out.getvalue())
