"""A bounded bulk TCP transfer that measures one emulated link (run as a script inside a namespace).

    python linkprobe.py recv ADDRESS PORT DEADLINE_S
        listen, print {"ready": true}, take one connection, read to EOF (or the deadline), then
        print the result as one JSON line
    python linkprobe.py send SOURCE ADDRESS PORT SECONDS MAX_BYTES SNDBUF
        connect from SOURCE (which picks the interface on a multi-NIC node) and write zeros for
        SECONDS or MAX_BYTES, whichever ends first

The receiver times the steady part of the transfer: from WARMUP after the first byte to the last
byte. TCP delivers goodput; the link carries frames, so the wire rate is goodput * (MTU + 14) /
MSS (full-size segments: IP and TCP headers and options inside the MTU, a 14-byte Ethernet header
outside it), the unit in which htb meters a link. Standard library only: no phub import, so it
starts fast.
"""
import json
import socket
import sys
import time

WARMUP = 0.1  # seconds after the first byte that are not timed (slow start, the shaper's burst)
IP_MTU = 14  # <linux/in.h>


def receive(address: str, port: int, deadline_s: float) -> dict:
    end = time.monotonic() + deadline_s
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(1)
        listener.settimeout(deadline_s)
        print(json.dumps({"ready": True}), flush=True)
        conn, _ = listener.accept()
    with conn:
        buf = bytearray(1 << 20)
        total, first, mark, mark_bytes, last = 0, None, None, 0, None
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            conn.settimeout(left)
            try:
                n = conn.recv_into(buf)
            except socket.timeout:
                break
            if not n:
                break
            now = time.monotonic()
            if first is None:
                first = now
            total += n
            last = now
            if mark is None and now - first >= WARMUP:
                mark, mark_bytes = now, total
        mss = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
        mtu = conn.getsockopt(socket.IPPROTO_IP, IP_MTU)
    if mark is None or last - mark < 0.05:  # too short to skip the warm-up: time all of it
        mark, mark_bytes = first, 0
    seconds = (last - mark) if last is not None and mark is not None else 0.0
    goodput = (total - mark_bytes) * 8 / seconds / 1e6 if seconds > 0 else 0.0
    return {"bytes": total, "seconds": seconds, "goodput_mbit": goodput,
            "wire_mbit": goodput * (mtu + 14) / mss if mss else goodput, "mss": mss, "mtu": mtu}


def send(source: str, address: str, port: int, seconds: float, max_bytes: int, sndbuf: int) -> None:
    with socket.socket() as sock:
        sock.bind((source, 0))
        # a small send buffer: data still queued when the time is up drains within ~40 ms
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        sock.settimeout(seconds + 5.0)
        sock.connect((address, port))
        block = bytes(1 << 16)
        sent, end = 0, time.monotonic() + seconds
        while sent < max_bytes and time.monotonic() < end:
            sent += sock.send(block[:max_bytes - sent])


def main(argv) -> int:
    if argv[:1] == ["recv"] and len(argv) == 4:
        print(json.dumps(receive(argv[1], int(argv[2]), float(argv[3]))), flush=True)
        return 0
    if argv[:1] == ["send"] and len(argv) == 7:
        send(argv[1], argv[2], int(argv[3]), float(argv[4]), int(argv[5]), int(argv[6]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
