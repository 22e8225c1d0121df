"""The thin pyverbs layer: what runs without a device, the probe's sentences, and a device loopback.

The probe tests put a stand-in `pyverbs` in sys.modules: they check how phub turns what pyverbs
reports into the doctor's sentences, which this machine (no RDMA) could not otherwise show.
"""
import sys
import time
import types

import numpy as np
import pytest

import phub

from phub.launching import doctor
from phub.errors import ConfigError
from phub.network.rdma import immediate, verbs
from phub.network.rdma.connect import ZERO_GID, ConnParams


def test_send_credits_signal_periodically_and_never_strand_a_full_queue():
    credits = verbs.SendCredits(depth=8, signal_every=3)
    taken = [credits.take() for _ in range(8)]
    assert [wr_id for wr_id, _ in taken] == list(range(1, 9))
    assert [signaled for _, signaled in taken] == [False, False, True, False, False, True, False, True]
    assert credits.free == 0
    with pytest.raises(RuntimeError, match="send queue full"):
        credits.take()
    credits.completed(6)  # retires 1..6 (an RC send queue completes in order)
    assert credits.free == 6
    with pytest.raises(ValueError, match="completion for request 5"):
        credits.completed(5)
    credits.completed(8)
    assert credits.free == 8
    with pytest.raises(ConfigError, match="signal_every must be in"):
        verbs.SendCredits(depth=4, signal_every=5)


def test_send_credits_any_depth_and_interval_keep_going_with_only_signaled_completions():
    for depth in range(1, 12):
        for every in range(1, depth + 1):
            credits, in_flight = verbs.SendCredits(depth, every), []
            for _ in range(5 * depth):
                if credits.free == 0:
                    assert in_flight, "a full queue with no signaled request would never drain"
                    credits.completed(in_flight.pop())
                    in_flight.clear()
                wr_id, signaled = credits.take()
                if signaled:
                    in_flight.append(wr_id)


def test_memory_is_page_aligned_zeroed_and_viewable():
    memory = verbs.Memory(3 * 4096 + 100)
    assert memory.address % 4096 == 0
    view = memory.floats(4096, 1024)
    assert not view.any()
    view[:] = np.arange(1024, dtype=np.float32)
    again = memory.floats(4096 + 4, 2)
    assert list(again) == [1.0, 2.0]
    with pytest.raises(ValueError, match="not a float32 span"):
        memory.floats(3 * 4096 + 100 - 4, 2)
    with pytest.raises(ValueError, match="not a float32 span"):
        memory.floats(2, 1)
    del view, again
    memory.close()


def test_mtu_values():
    assert [verbs.mtu_bytes(v) for v in range(1, 6)] == [256, 512, 1024, 2048, 4096]
    assert all(verbs.mtu_enum(verbs.mtu_bytes(v)) == v for v in range(1, 6))
    with pytest.raises(ValueError):
        verbs.mtu_enum(1500)


# -- the probe, through a stand-in pyverbs ---------------------------------------------------
class _Port:
    def __init__(self, state):
        self.state, self.link_layer, self.lid, self.active_mtu, self.gid_tbl_len = state, 2, 0, 5, 1


def fake_pyverbs(monkeypatch, devices=None, list_error=None, import_error=None):
    """Install a stand-in pyverbs: `devices` maps a name to its ports' states (4 = ACTIVE)."""
    monkeypatch.setattr(verbs, "_loaded", None)
    for name in [m for m in sys.modules if m == "pyverbs" or m.startswith("pyverbs.")]:
        monkeypatch.delitem(sys.modules, name)
    if import_error == "absent":
        monkeypatch.setitem(sys.modules, "pyverbs", None)
        return
    package = types.ModuleType("pyverbs")
    package.__path__ = []
    monkeypatch.setitem(sys.modules, "pyverbs", package)
    mods = {name: types.ModuleType(f"pyverbs.{name}") for name in verbs._MODULES}
    mods["enums"].IBV_PORT_ACTIVE, mods["enums"].IBV_LINK_LAYER_ETHERNET = 4, 2

    class Context:
        def __init__(self, name):
            self.ports = devices[name]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def query_device(self):
            return types.SimpleNamespace(node_guid=0xABC, phys_port_cnt=len(self.ports))

        def query_port(self, port):
            return _Port(self.ports[port - 1])

        def query_gid(self, port, index):
            return types.SimpleNamespace(gid="FE80:0000:0000:0000:0000:0000:0000:0001")

    def get_device_list():
        if list_error:
            raise RuntimeError(list_error)
        return [types.SimpleNamespace(name=name.encode()) for name in devices]

    mods["device"].Context, mods["device"].get_device_list = Context, get_device_list
    for name, module in mods.items():
        monkeypatch.setitem(sys.modules, f"pyverbs.{name}", module)


def test_probe_reports_a_missing_module_as_a_sentence(monkeypatch):
    fake_pyverbs(monkeypatch, import_error="absent")
    report = verbs.probe()
    assert report["pyverbs"] is False and report["devices"] == [] and report["usable"] == []
    assert report["reason"].startswith("the Python module pyverbs is not importable from this Python")
    with pytest.raises(verbs.VerbsUnavailable, match="pyverbs is not importable"):
        verbs.load()


def test_probe_reports_a_kernel_without_rdma(monkeypatch):
    fake_pyverbs(monkeypatch, devices={}, list_error="Failed to get devices list")
    report = verbs.probe()
    assert report["pyverbs"] is True and "listing devices failed: Failed to get devices list" in report["reason"]


def test_probe_reports_devices_whose_ports_are_down(monkeypatch):
    fake_pyverbs(monkeypatch, devices={"mlx5_0": [1], "mlx5_1": [1, 2]})
    report = verbs.probe()
    assert [d["name"] for d in report["devices"]] == ["mlx5_0", "mlx5_1"] and report["usable"] == []
    assert "RDMA device(s) mlx5_0, mlx5_1 found, but no port is ACTIVE" in report["reason"]
    status = doctor.verbs_transport(report)
    assert status == {"available": False, "hardware": False, "reason": report["reason"]}


def test_probe_finds_an_active_port_and_the_verbs_transport_can_run(monkeypatch):
    fake_pyverbs(monkeypatch, devices={"mlx5_0": [1, 4]})
    report = verbs.probe()
    assert report["reason"] is None and report["usable"] == ["mlx5_0:2"]
    port = report["devices"][0]["ports"][1]
    assert port == {"port": 2, "state": 4, "active": True, "link_layer": "ethernet", "lid": 0, "mtu": 4096,
                    "gid": "fe80:0000:0000:0000:0000:0000:0000:0001"}
    assert doctor.verbs_transport(report) == {"available": True, "hardware": True, "reason": None}
    doctor.require_transport("verbs")  # does not raise


# -- with the real pyverbs ------------------------------------------------------------------
def real_pyverbs():
    try:
        return verbs.load()
    except verbs.VerbsUnavailable as exc:
        pytest.skip(f"needs pyverbs: {exc}")


def test_work_requests_build_with_the_real_pyverbs():
    """No device needed: the attribute objects the layer hands to pyverbs accept what it sets."""
    pv = real_pyverbs()

    class RecordingQP:
        qp_num = 0x42

        def to_rts(self, attr):
            self.attr = attr

        def post_send(self, wr):
            self.wr = wr

    memory = verbs.Memory(8192)
    region = verbs.Region(memory, rkey=22, lkey=11)
    nic = types.SimpleNamespace(pv=pv, port=1, gid_index=3, lid=5, gid=ZERO_GID, mtu=4096, scratch=region)
    conn = object.__new__(verbs.RcConnection)  # everything but the device objects
    conn.nic, conn.qp, conn.qp_num, conn.psn, conn.remote = nic, RecordingQP(), 0x42, 77, None
    conn.credits = verbs.SendCredits(4, 2)
    remote = ConnParams(qp_num=0x456, psn=99, lid=9, gid="fe80:0000:0000:0000:0202:c9ff:fe00:0002", mtu=1024,
                        addr=1 << 40, rkey=33, length=1 << 20)
    conn.connect(remote)
    attr = conn.qp.attr
    assert (attr.dest_qp_num, attr.rq_psn, attr.sq_psn, attr.path_mtu) == (0x456, 99, 77, verbs.mtu_enum(1024))
    assert attr.ah_attr.is_global == 1 and attr.ah_attr.dgid == remote.gid and attr.ah_attr.sgid_index == 3
    assert conn.local_params(region).rkey == 22 and conn.local_params(region).addr == memory.address
    assert conn.write_imm(region, 0, 4096, remote, 8192, immediate.encode(3, 17)) is False
    wr = conn.qp.wr
    assert wr.opcode == pv.enums.IBV_WR_RDMA_WRITE_WITH_IMM and wr.num_sge == 1
    assert immediate.from_wire(wr.imm_data) == immediate.encode(3, 17)
    assert conn.write_imm(region, 4096, 4096, remote, 0, immediate.encode(3, 18)) is True
    assert conn.qp.wr.send_flags == pv.enums.IBV_SEND_SIGNALED
    with pytest.raises(ValueError, match="outside the peer's"):
        conn.write_imm(region, 0, 4096, remote, (1 << 20) - 4, 0)


def test_rc_write_with_immediate_on_a_real_device():
    """Two queue pairs of one port, connected to each other: a write lands with its immediate."""
    real_pyverbs()
    report = verbs.probe()
    if not report["usable"]:
        pytest.skip(f"needs an RDMA device: {report['reason']}")
    nic = verbs.open_nic(report["usable"][0])
    try:
        region = nic.register(verbs.Memory(4 * 4096))
        a, b = nic.connection(sq_depth=8, rq_depth=8, signal_every=1), nic.connection()
        a.connect(b.local_params(region))
        b.connect(a.local_params(region))
        b.post_receives(4)
        region.memory.floats(0, 1024)[:] = np.arange(1024, dtype=np.float32)
        imm = immediate.encode(5, 123)
        assert a.write_imm(region, 0, 4096, b.local_params(region), 8192, imm) is True
        done, deadline = [], time.monotonic() + 10
        while len(done) < 2 and time.monotonic() < deadline:
            done += nic.poll()
        received = [c for c in done if c.received]
        assert len(done) == 2 and len(received) == 1, done
        assert received[0].imm == imm and received[0].byte_len == 4096 and received[0].qp_num == b.qp_num
        np.testing.assert_array_equal(region.memory.floats(8192, 1024), np.arange(1024, dtype=np.float32))
    finally:
        nic.close()


def test_nag_over_a_real_device_matches_closed_form(run_exchange):
    """The whole data path on real queue pairs: what test_verbs_soft.py runs over the software provider."""
    real_pyverbs()
    report = verbs.probe()
    if not report["usable"]:
        pytest.skip(f"needs an RDMA device: {report['reason']}")
    from test_exchange import SIZES, STEPS, assert_close, nag_oracle

    opt = phub.NAG(learning_rate=0.1, momentum=0.9, wd=1e-2, rescale_grad=1.0 / 2)
    results = run_exchange(2, SIZES, STEPS, opt, cores=2, transport="verbs")
    for rank, saved in enumerate(results):
        assert str(saved["transport"]) == "verbs"
        for i, shape in enumerate(SIZES):
            want = nag_oracle(2, i, int(np.prod(shape)), STEPS, 0.1, 0.9, 1e-2, 1.0 / 2)
            assert_close(saved[f"final{i}"].reshape(-1), want, f"rank {rank} array {i}")
