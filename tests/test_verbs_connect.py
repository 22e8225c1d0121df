"""Queue-pair connection parameters: validation, and a handshake frame read over real TCP."""
import socket

import pytest

from phub.protocol import wire
from phub.errors import JobFailed, PHubTimeout, ProtocolError
from phub.network.rdma.connect import FIELD, ZERO_GID, ConnParams, attach, extract, path_mtu
from phub.network.links import recv_control

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


def test_a_handshake_read_takes_one_control_frame_and_refuses_data_silence_and_a_close(tcp_pair):
    client, server = tcp_pair
    body = attach({"lane": 3}, ConnParams(**WORKER))
    client.sendall(wire.control_frame(wire.Kind.HELLO, 5, 2, body))
    frame = recv_control(server, 10)
    assert frame.header.kind is wire.Kind.HELLO and extract(frame.json(), "rank 2") == ConnParams(**WORKER)
    client.sendall(wire.pack_header(wire.Kind.PUSH, 5, 2, 0, 1, 4) + b"\0\0\0\0")
    with pytest.raises(ProtocolError, match="expected a control frame during the handshake, got PUSH"):
        recv_control(server, 10)
    with pytest.raises(PHubTimeout, match="no answer from the server within 0.2 s"):
        recv_control(client, 0.2, "the server")
    client.close()
    with pytest.raises(JobFailed, match="rank 2 closed the connection during the handshake"):
        recv_control(server, 10, "rank 2")
