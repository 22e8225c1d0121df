"""What a HELLO may ask of one server core, decided without sockets: `messages.hello` types and
bounds it, `Job.refusal` and `Job.lane_refusal` say why it is turned away (the core only sends
the answer). Every rule once, with the culprit named in the message."""
import pytest

from phub.protocol import messages
from phub.reduction.aggregation import JobState
from phub.reduction.chunking import Topology
from phub.config import JobSpec
from phub.errors import ProtocolError
from phub.reduction.kernels import get_backend
from phub.protocol.jobs import Job

LIMITS = messages.Limits(job_ids=frozenset({7}), cores=1, racks=2)


def hello(**fields):
    body = {"job": 7, "token": "s3cret", "rank": 2, "num_workers": 4, "lane": 0, **fields}
    return messages.hello(body, LIMITS)


def server_job(ended=None):
    """Ranks 2 and 3 of a 4-worker job 7, with the state its first lane HELLO would set up."""
    job = Job(JobSpec(7, 2, "s3cret", first_rank=2, total_workers=4), now=0.0)
    job.ended = ended
    job.state = JobState(7, 2, Topology(interfaces=2, cores=1), 32 * 1024, 0, get_backend("reference"),
                         total_workers=4)
    job.links = {lane: [None, None] for lane in sorted(job.state.lanes)}
    return job


def test_a_good_hello_is_admitted():
    job = server_job()
    assert job.refusal(hello()) is None and job.lane_refusal(hello(), interface=0) is None
    assert job.lane_refusal(hello(lane=1), interface=1) is None  # lane 1 is the second interface's


@pytest.mark.parametrize("fields, words", [
    ({"token": "guess"}, ["wrong token", "job 7"]),
    ({"rank": 1}, ["rank 1", "not one of this server's ranks", "2..3"]),
    ({"rank": 3, "num_workers": 5}, ["rank 3 expects 5 workers", "has 4"]),
])
def test_a_worker_hello_is_refused_naming_why(fields, words):
    message = server_job().refusal(hello(**fields))
    assert message and all(word in message for word in words), message


def test_an_ended_job_admits_no_one_not_even_a_rack():
    job = server_job(ended="")
    assert "has already ended" in job.refusal(hello())
    assert "has already ended" in job.refusal(messages.hello({"job": 7, "token": "s3cret", "peer_rack": 1, "core": 0, "interface": 0},
                                                              LIMITS))
    assert server_job().refusal(messages.hello({"job": 7, "token": "s3cret", "peer_rack": 1, "core": 0, "interface": 0},
                                               LIMITS)) is None  # a rack's rank and worker count are not checked


def test_a_lane_is_refused_when_it_is_not_served_here_or_taken_or_the_shards_disagree():
    job = server_job()
    assert "lane 1 is not served on this core/interface" in job.lane_refusal(hello(lane=1), interface=0)
    assert "lane 9 is not served" in job.lane_refusal(hello(lane=9), interface=0)
    job.links[0][0] = object()  # rank 2 (local 0) has lane 0 already
    assert "rank 2 connected lane 0 twice" in job.lane_refusal(hello(), interface=0)
    assert job.lane_refusal(hello(rank=3), interface=0) is None
    message = job.lane_refusal(hello(rank=3, shard=1, shards=2), interface=0)
    assert "rank 3 says this server is shard 1 of 2, other workers said 0 of 1" in message


@pytest.mark.parametrize("body, words", [
    ({"job": 8, "token": "", "rank": 0, "num_workers": 1, "lane": 0}, ["job 8 is not registered"]),
    ({"job": 7, "rank": 0, "num_workers": 1, "lane": 0, "colour": "red"}, ["unknown field", "colour"]),
    ({"job": 7, "rank": -1, "num_workers": 1, "lane": 0}, ["rank"]),
    ({"job": 7, "rank": 0, "num_workers": 1, "lane": 0, "shard": 2, "shards": 2}, ["shard"]),
    ({"job": 7, "peer_rack": 2, "core": 0}, ["peer_rack"]),
])
def test_a_malformed_hello_is_a_protocol_error(body, words):
    with pytest.raises(ProtocolError) as info:
        messages.hello(body, LIMITS)
    assert all(word in str(info.value) for word in words), str(info.value)
