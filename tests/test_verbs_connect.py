"""Queue-pair connection parameters: validation, and the HELLO/WELCOME exchange over real TCP."""
import socket
import threading

import pytest

from phub import wire
from phub.errors import JobFailed, PHubTimeout, ProtocolError
from phub.rdma.connect import (FIELD, ZERO_GID, ConnParams, attach, extract, path_mtu, recv_control,
                               server_handshake, worker_handshake)

WORKER = dict(qp_num=0x12345, psn=0xABCDE, lid=7, gid="fe80:0000:0000:0000:0202:c9ff:fe00:0001", mtu=4096,
              addr=0x7F00_0000_1000, rkey=0xDEADBEEF, length=1 << 20)
SERVER = dict(qp_num=0xFFFFFF, psn=0, lid=0, gid=ZERO_GID, mtu=1024, addr=(1 << 64) - 4096, rkey=0, length=4096)


@pytest.fixture
def tcp_pair():
    """A connected (client, server) pair of TCP sockets on loopback."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=10)
        server, _ = listener.accept()
    yield client, server
    client.close()
    server.close()


def test_params_round_trip_through_json():
    for fields in (WORKER, SERVER):
        params = ConnParams(**fields)
        assert ConnParams.from_json(params.to_json()) == params
        assert extract(attach({"job": 1}, params)) == params
    assert path_mtu(ConnParams(**WORKER), ConnParams(**SERVER)) == 1024


@pytest.mark.parametrize("change, message", [
    ({"qp_num": 1 << 24}, r"rdma.qp_num = 16777216 is outside \[0, 16777216\)"),
    ({"psn": -1}, r"rdma.psn = -1 is outside"),
    ({"lid": True}, "rdma.lid must be an integer, got True"),
    ({"rkey": "5"}, "rdma.rkey must be an integer, got '5'"),
    ({"rkey": 1 << 32}, "rdma.rkey = 4294967296 is outside"),
    ({"addr": (1 << 64) - 10}, "wraps around"),
    ({"length": 0}, "is empty"),
    ({"gid": "FE80:0000:0000:0000:0202:C9FF:FE00:0001"}, "rdma.gid must be 8 colon-separated groups"),
    ({"gid": "fe80::1"}, "rdma.gid must be"),
    ({"mtu": 1500}, r"rdma.mtu must be one of \(256, 512, 1024, 2048, 4096\), got 1500"),
    ({"mtu": 1024.0}, "rdma.mtu must be one of"),
])
def test_malformed_params_are_protocol_errors_naming_the_field(change, message):
    with pytest.raises(ProtocolError, match=message):
        ConnParams.from_json(dict(WORKER, **change), "rank 3")
    with pytest.raises(ProtocolError, match="rank 3 sent bad rdma parameters"):
        ConnParams.from_json(dict(WORKER, **change), "rank 3")


def test_missing_extra_and_non_object_params():
    with pytest.raises(ProtocolError, match="rank 1 sent rdma parameters without psn, rkey"):
        ConnParams.from_json({k: v for k, v in WORKER.items() if k not in ("psn", "rkey")}, "rank 1")
    with pytest.raises(ProtocolError, match="unknown rdma parameters port"):
        ConnParams.from_json(dict(WORKER, port=1), "rank 1")
    with pytest.raises(ProtocolError, match="not a JSON object"):
        ConnParams.from_json([1, 2], "rank 1")
    with pytest.raises(ProtocolError, match="did not send rdma parameters"):
        extract({"job": 0}, "rank 1")
    with pytest.raises(ProtocolError, match="registered 4096 bytes, the plan needs 8192"):
        ConnParams(**SERVER).check_covers(8192, "the server")


def test_exchange_over_tcp_gives_each_side_the_others_params(tcp_pair):
    client, server = tcp_pair
    worker_params, server_params = ConnParams(**WORKER), ConnParams(**SERVER)
    seen = {}

    def answer(hello, remote):
        seen["hello"], seen["remote"] = hello, remote
        return {"cores": 2, "lane": hello["lane"]}, server_params

    def serve():
        try:
            seen["result"] = server_handshake(server, answer, job=5, timeout=10)
        except Exception as exc:  # reported by the main thread's assertions
            seen["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    welcome, got = worker_handshake(client, {"job": 5, "rank": 2, "lane": 3}, worker_params, job=5, rank=2,
                                    timeout=10)
    thread.join(10)
    assert not thread.is_alive() and "error" not in seen
    assert got == server_params and welcome["cores"] == 2 and welcome["lane"] == 3
    assert seen["remote"] == worker_params and seen["hello"]["rank"] == 2
    assert seen["result"] == (seen["hello"], worker_params)


def send_hello(sock, body, job=5, sender=2):
    sock.sendall(wire.control_frame(wire.Kind.HELLO, job, sender, body))


@pytest.mark.parametrize("body, job, message", [
    ({"lane": 0, FIELD: dict(WORKER, gid="nope")}, 5, "rank 2 sent bad rdma parameters: rdma.gid must be"),
    ({"lane": 0, FIELD: dict(WORKER, qp_num=-3)}, 5, "rdma.qp_num = -3 is outside"),
    ({"lane": 0}, 5, "rank 2 did not send rdma parameters"),
    ({"lane": 0, FIELD: WORKER}, 6, "HELLO for job 6, this server runs job 5"),
])
def test_bad_hello_is_answered_with_an_error_naming_the_problem(tcp_pair, body, job, message):
    client, server = tcp_pair
    send_hello(client, body, job=job)
    with pytest.raises(ProtocolError, match=message):
        server_handshake(server, lambda hello, remote: pytest.fail("answer called for a bad HELLO"), job=5,
                         timeout=10)
    reply = recv_control(client, 10)
    assert reply.header.kind is wire.Kind.ERROR and message.split(":")[0] in reply.json()["message"]


def test_server_rejects_a_data_frame_or_a_close_during_the_handshake(tcp_pair):
    client, server = tcp_pair
    client.sendall(wire.pack_header(wire.Kind.PUSH, 5, 2, 0, 1, 4) + b"\0\0\0\0")
    with pytest.raises(ProtocolError, match="expected a control frame during the rdma handshake, got PUSH"):
        server_handshake(server, lambda hello, remote: None, timeout=10)
    client.close()
    with pytest.raises(ProtocolError, match="closed the connection during the rdma handshake"):
        recv_control(server, 10)


def test_worker_sees_refusals_and_bad_welcomes(tcp_pair):
    client, server = tcp_pair
    params = ConnParams(**WORKER)
    server.sendall(wire.control_frame(wire.Kind.ERROR, 5, wire.SERVER_SENDER, {"message": "lane 9 is not served"}))
    with pytest.raises(JobFailed, match="refused the rdma handshake: lane 9 is not served"):
        worker_handshake(client, {"lane": 9}, params, job=5, rank=2, timeout=10)
    server.sendall(wire.control_frame(wire.Kind.WELCOME, 5, wire.SERVER_SENDER, {"cores": 1}))
    with pytest.raises(ProtocolError, match="the server did not send rdma parameters"):
        worker_handshake(client, {"lane": 0}, params, job=5, rank=2, timeout=10)
    server.sendall(wire.control_frame(wire.Kind.READY, 5, wire.SERVER_SENDER, {"batch": 0}))
    with pytest.raises(ProtocolError, match="expected WELCOME, got READY"):
        worker_handshake(client, {"lane": 0}, params, job=5, rank=2, timeout=10)
    server.sendall(b"XXXX" + bytes(28))
    with pytest.raises(ProtocolError, match="bad magic"):
        worker_handshake(client, {"lane": 0}, params, job=5, rank=2, timeout=10)


def test_handshake_times_out_on_a_silent_peer(tcp_pair):
    client, _ = tcp_pair
    with pytest.raises(PHubTimeout, match="no handshake frame within 0.2 s"):
        recv_control(client, 0.2)
