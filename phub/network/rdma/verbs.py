"""The "verbs" provider of `phub.network.rdma.fabric`: pyverbs (rdma-core's Python bindings), the only
code that touches a device.

Nothing here runs at import time: pyverbs is imported by `load()`, on first use, so `phub` works
on machines without it. What it offers, in the order a connection needs it:

- `probe()`: the RDMA devices and ports this machine has, or a sentence saying why none can be
  used (what `phub doctor` prints and what choosing the verbs transport fails with).
- `open_nic(device)` -> `Nic`: device context, protection domain, one completion queue that the
  owning loop polls (`Nic.poll`: completions as `fabric.Completion`s; a failed work request
  raises JobFailed), and `Nic.register(memory)` (one memory region).
- `RcConnection`: one RC queue pair on a `Nic`: its `ConnParams`, the INIT -> RTR -> RTS
  transitions from the peer's parameters, receive requests (a write-with-immediate consumes
  one), and `write_imm` (RDMA write-with-immediate into the peer's region), unsignaled but for
  every `signal_every`-th (`fabric.SendCredits`).

Every call that can fail on a device raises pyverbs' own exception, except where noted. This
module runs on real hardware only (its device test skips without one); the same operations in
software (`phub.network.rdma.soft`) run the data path in the tests.
"""
from __future__ import annotations

import glob
import os
import random
import sys
import types
from typing import List, Optional

from ...errors import ConfigError, JobFailed
from .connect import ZERO_GID, ConnParams, path_mtu
from .fabric import Completion, Memory, Region, SendCredits, check_write
from .immediate import from_wire, to_wire

__all__ = ["VerbsUnavailable", "probe", "open_nic", "Nic", "RcConnection", "Memory", "Region", "SendCredits", "Completion"]

_MODULES = ("device", "pd", "mr", "cq", "qp", "wr", "addr", "enums", "pyverbs_error")
_loaded: Optional[types.SimpleNamespace] = None


class VerbsUnavailable(ConfigError):
    """pyverbs cannot be loaded here; the message says why in one sentence."""


def _system_copy_hint() -> str:
    """Where a distribution's pyverbs sits when this interpreter does not see it (a venv, pyenv)."""
    pattern = "/usr/lib*/python3*/*-packages/pyverbs"
    found = sorted(glob.glob(pattern))
    if not found:
        return ("install rdma-core's Python bindings (Debian/Ubuntu: python3-pyverbs; conda-forge: rdma-core) "
                "and make them importable")
    return (f"a system copy exists in {os.path.dirname(found[0])}: create the venv with "
            "--system-site-packages, or add that folder to a .pth file in the venv")


def load() -> types.SimpleNamespace:
    """Import pyverbs' modules once; raise VerbsUnavailable with a sentence if they do not load."""
    global _loaded
    if _loaded is not None:
        return _loaded
    try:
        import importlib

        modules = {name: importlib.import_module(f"pyverbs.{name}") for name in _MODULES}
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "pyverbs":
            raise VerbsUnavailable(f"the Python module pyverbs is not importable from this Python "
                                   f"({sys.version.split()[0]}): {_system_copy_hint()}") from None
        raise VerbsUnavailable(f"pyverbs is installed but does not load: {exc}") from None
    except (ImportError, OSError) as exc:  # e.g. libibverbs missing, or built for another Python
        raise VerbsUnavailable(f"pyverbs is installed but does not load: {exc}") from None
    _loaded = types.SimpleNamespace(**modules)
    return _loaded


def mtu_bytes(enum_value: int) -> int:
    """Bytes of an `ibv_mtu` value (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5)."""
    if not 1 <= enum_value <= 5:
        raise ValueError(f"not an ibv_mtu value: {enum_value!r}")
    return 256 << (enum_value - 1)


def mtu_enum(nbytes: int) -> int:
    """The `ibv_mtu` value of an MTU in bytes (256, 512, 1024, 2048 or 4096)."""
    for value in range(1, 6):
        if mtu_bytes(value) == nbytes:
            return value
    raise ValueError(f"not an RDMA path MTU: {nbytes!r} bytes")


def _kernel_reason(detail: str) -> str:
    if not os.path.isdir("/sys/class/infiniband"):
        return ("this kernel exposes no RDMA devices (/sys/class/infiniband is missing: no RDMA driver is "
                f"loaded, or the kernel has no RDMA support; {detail})")
    if not glob.glob("/dev/infiniband/uverbs*"):
        return f"RDMA devices exist but none is open to user space (no /dev/infiniband/uverbs*: load ib_uverbs; {detail})"
    return detail


def probe() -> dict:
    """The RDMA picture of this machine. Never raises.

    Returns {"pyverbs": bool, "devices": [{"name", "node_guid", "ports": [{"port", "state",
    "active", "link_layer", "lid", "mtu", "gid"}]}], "usable": ["dev:port", ...], "reason": str or
    None}. `reason` is set exactly when no port is usable, and says why.
    """
    report = {"pyverbs": False, "devices": [], "usable": [], "reason": None}
    try:
        pv = load()
    except VerbsUnavailable as exc:
        report["reason"] = str(exc)
        return report
    report["pyverbs"] = True
    try:
        devices = pv.device.get_device_list()
    except Exception as exc:  # pyverbs raises its own error when the kernel has no RDMA support
        report["reason"] = _kernel_reason(f"listing devices failed: {exc}")
        return report
    if not devices:
        report["reason"] = _kernel_reason("no RDMA devices found")
        return report
    e = pv.enums
    for dev in devices:
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        entry = {"name": name, "node_guid": None, "ports": [], "error": None}
        report["devices"].append(entry)
        try:
            with pv.device.Context(name=name) as ctx:
                attr = ctx.query_device()
                entry["node_guid"] = f"{attr.node_guid:016x}"
                for port in range(1, attr.phys_port_cnt + 1):
                    pa = ctx.query_port(port)
                    active = pa.state == e.IBV_PORT_ACTIVE
                    ethernet = pa.link_layer == e.IBV_LINK_LAYER_ETHERNET
                    gid = ctx.query_gid(port, 0).gid.lower() if pa.gid_tbl_len else ZERO_GID
                    entry["ports"].append({"port": port, "state": int(pa.state), "active": active,
                                           "link_layer": "ethernet" if ethernet else "infiniband",
                                           "lid": int(pa.lid), "mtu": mtu_bytes(pa.active_mtu), "gid": gid})
                    if active:
                        report["usable"].append(f"{name}:{port}")
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
    if not report["usable"]:
        names = ", ".join(d["name"] for d in report["devices"])
        report["reason"] = (f"RDMA device(s) {names} found, but no port is ACTIVE "
                            "(check the link, and on InfiniBand that a subnet manager runs; see ibv_devinfo)")
    return report


def open_nic(device: Optional[str] = None) -> "Nic":
    """The provider entry point (`phub.network.rdma.fabric.open_nic`): a `Nic` on "NAME[:PORT]", or on the
    first usable port. ConfigError with the probe's sentence if there is none."""
    if device is None:
        report = probe()
        if not report["usable"]:
            raise ConfigError(f"no usable RDMA port: {report['reason']}")
        device = report["usable"][0]
    name, _, port = device.partition(":")
    try:
        port_number = int(port or 1)
    except ValueError:
        raise ConfigError(f"RDMA device {device!r}: expected NAME or NAME:PORT") from None
    return Nic(name, port=port_number)


class Nic:
    """One device port: context, protection domain, one completion queue the owning loop polls."""

    nap = 0.0  # PHub's cores poll without sleeping

    def __init__(self, device: str, *, port: int = 1, gid_index: int = 0, cq_depth: int = 65536):
        # cq_depth: a core's NIC completes one receive per push of every worker on it; a deep
        # queue lets the core fall behind for a while without overrunning it (a fatal error)
        pv = self.pv = load()
        e = pv.enums
        self.port = port
        self.gid_index = gid_index
        self.context = pv.device.Context(name=device)
        self.pd = pv.pd.PD(self.context)
        self.cq = pv.cq.CQ(self.context, cq_depth, None, None, 0)
        attr = self.context.query_port(port)
        self.lid = int(attr.lid)
        self.mtu = mtu_bytes(attr.active_mtu)
        self.gid = self.context.query_gid(port, gid_index).gid.lower() if attr.gid_tbl_len else ZERO_GID
        self._access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.scratch = self.register(Memory(4096))  # the (empty) scatter entry of receive requests

    def register(self, memory: Memory) -> Region:
        """Register `memory` once for local use and remote writes."""
        mr = self.pv.mr.MR(self.pd, memory.length, self._access, address=memory.address)
        return Region(memory, mr.rkey, mr.lkey, mr)

    def connection(self, **options) -> "RcConnection":
        return RcConnection(self, **options)

    def poll(self, max_entries: int = 64) -> List[Completion]:
        """The completions waiting (none: an empty list; never blocks).

        Raises JobFailed naming the queue pair and the status if a work request failed.
        """
        e = self.pv.enums
        _, wcs = self.cq.poll(max_entries)
        out = []
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                raise JobFailed(f"RDMA work request {wc.wr_id} on queue pair {wc.qp_num} failed with status "
                                f"{wc.status} (vendor error {wc.vendor_err})")
            imm = from_wire(wc.imm_data) if wc.wc_flags & e.IBV_WC_WITH_IMM else None
            out.append(Completion(wc.wr_id, wc.opcode, wc.qp_num, wc.byte_len, imm))
        return out

    def close(self) -> None:
        """Destroy the device objects (pyverbs closes what the context owns), then the context."""
        self.context.close()


class RcConnection:
    """One RC queue pair on `nic`, sending through `credits`."""

    def __init__(self, nic: Nic, *, sq_depth: int = 256, rq_depth: int = 2048, signal_every: int = 64):
        pv, e = nic.pv, nic.pv.enums
        self.nic = nic
        self.credits = SendCredits(sq_depth, signal_every)
        cap = pv.qp.QPCap(max_send_wr=sq_depth, max_recv_wr=rq_depth, max_send_sge=1, max_recv_sge=1)
        init = pv.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=nic.cq, rcq=nic.cq, cap=cap, sq_sig_all=0)
        attr = pv.qp.QPAttr(port_num=nic.port)
        attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_LOCAL_WRITE
        self.qp = pv.qp.QP(nic.pd, init, attr)  # created and moved to INIT
        self.qp_num = self.qp.qp_num
        self.psn = random.getrandbits(24)
        self.remote: Optional[ConnParams] = None

    def local_params(self, region: Region) -> ConnParams:
        """What the peer needs to reach this queue pair and write into `region`."""
        nic = self.nic
        return ConnParams(qp_num=self.qp_num, psn=self.psn, lid=nic.lid, gid=nic.gid, mtu=nic.mtu,
                          addr=region.addr, rkey=region.rkey, length=region.length)

    def connect(self, remote: ConnParams) -> None:
        """INIT -> RTR -> RTS towards the peer described by `remote` (from the handshake)."""
        pv, e, nic = self.nic.pv, self.nic.pv.enums, self.nic
        attr = pv.qp.QPAttr(port_num=nic.port)
        attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_LOCAL_WRITE
        attr.path_mtu = mtu_enum(path_mtu(self.local_params(nic.scratch), remote))
        attr.dest_qp_num = remote.qp_num
        attr.rq_psn = remote.psn
        attr.sq_psn = self.psn
        attr.max_dest_rd_atomic = 1  # no RDMA reads or atomics are used
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = 12  # 0.64 ms before a peer retries a write that found no receive posted
        attr.timeout = 14  # ~67 ms local ACK timeout
        attr.retry_cnt = 7
        attr.rnr_retry = 7  # retry forever: a receiver that is briefly out of receives is slow, not dead
        routed = remote.gid != ZERO_GID  # RoCE always, InfiniBand across subnets: needs a GRH
        if routed:
            grh = pv.addr.GlobalRoute(dgid=pv.addr.GID(remote.gid), sgid_index=nic.gid_index, hop_limit=64)
            attr.ah_attr = pv.addr.AHAttr(port_num=nic.port, is_global=1, gr=grh, dlid=remote.lid)
        else:
            attr.ah_attr = pv.addr.AHAttr(port_num=nic.port, is_global=0, dlid=remote.lid)
        self.qp.to_rts(attr)  # goes through RTR first
        self.remote = remote

    def post_receives(self, count: int) -> None:
        """Post `count` receive requests; each incoming write-with-immediate consumes one.

        Their single scatter entry is empty: the written bytes go where the writer said, never
        into a receive buffer (pyverbs wants at least one entry; a zero-length one is ignored).
        """
        pv, scratch = self.nic.pv, self.nic.scratch
        sge = pv.wr.SGE(scratch.addr, 0, scratch.lkey)
        for _ in range(count):
            self.qp.post_recv(pv.wr.RecvWR(wr_id=0, num_sge=1, sg=[sge]))

    def write_imm(self, region: Region, local_offset: int, nbytes: int, target: ConnParams,
                  remote_offset: int, imm: int) -> bool:
        """Write `nbytes` at `local_offset` of `region` to `remote_offset` of the peer's region
        `target` (its ConnParams). `imm` is the host-order immediate. Returns whether the request
        was signaled; RuntimeError if the send queue is full (see `fabric.Writer`)."""
        check_write(self.remote, region, local_offset, nbytes, target, remote_offset)
        pv, e = self.nic.pv, self.nic.pv.enums
        wr_id, signaled = self.credits.take()
        sge = pv.wr.SGE(region.addr + local_offset, nbytes, region.lkey)
        wr = pv.wr.SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[sge],
                          imm_data=to_wire(imm), send_flags=e.IBV_SEND_SIGNALED if signaled else 0)
        wr.set_wr_rdma(target.rkey, target.addr + remote_offset)
        self.qp.post_send(wr)
        return signaled
