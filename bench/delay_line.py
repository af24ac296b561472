"""A user-space delay line between network namespaces (this kernel's ``tc`` has no netem).

Each namespace gets a tun device ``dt0`` (its address /24, a default route into it, so that
Chromium gathers ICE candidates on it). This process holds every tun's file descriptor: it
reads each IPv4 packet a namespace sends, holds it ``--delay-ms`` and writes it into the tun
of the namespace that owns the packet's destination address (packets for other addresses
are dropped). So every packet between two namespaces (UDP of WebRTC, the signaling TCP)
waits the delay once each way, whatever process sent it: Chromium's native SCTP included.

    python -m bench.delay_line --delay-ms 1 self:10.79.0.1 PID:10.79.0.11 ...

``self`` is this process's own namespace; ``PID`` the namespace of a running process
(``/proc/PID/ns/net``). It prints ``READY`` once every tun is up, then forwards until killed.
It asks for SCHED_FIFO (root) so that a loaded machine delays its wake-ups less; without it
it says so and goes on. ``echo`` mode times a UDP echo between two namespaces (the check
that the delay is there): ``python -m bench.delay_line --echo PID_A PID_B B_IP``.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import heapq
import json
import os
import select
import socket
import statistics
import struct
import subprocess
import sys
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
TUN = "dt0"
_libc = ctypes.CDLL(None, use_errno=True)


def setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns {path}: {os.strerror(e)}")
    finally:
        os.close(fd)


def ns_path(who: str) -> str:
    return "/proc/self/ns/net" if who == "self" else f"/proc/{who}/ns/net"


def in_ns(who: str, *cmd: str) -> None:
    pre = [] if who == "self" else ["nsenter", f"--net={ns_path(who)}", "--"]
    subprocess.run([*pre, *cmd], check=True, capture_output=True, text=True)


def open_tun(who: str, ip: str) -> int:
    """A tun device in namespace ``who`` with address ``ip``/24 and the default route."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        if who != "self":
            setns(ns_path(who))
        fd = os.open("/dev/net/tun", os.O_RDWR)  # the device belongs to the opener's namespace
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", TUN.encode(), IFF_TUN | IFF_NO_PI))
    finally:
        if _libc.setns(home, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back home")
        os.close(home)
    in_ns(who, "ip", "link", "set", "lo", "up")
    in_ns(who, "ip", "addr", "add", f"{ip}/24", "dev", TUN)
    in_ns(who, "ip", "link", "set", TUN, "up")
    in_ns(who, "ip", "route", "add", "default", "dev", TUN)
    os.set_blocking(fd, False)
    return fd


def forward(fds: dict[bytes, int], delay_s: float) -> None:
    """Read every tun, hold each IPv4 packet ``delay_s``, write it to its destination's tun."""
    by_fd = list(fds.values())
    held: list = []  # (due, seq, destination fd, packet)
    seq = 0
    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, dst, pkt = heapq.heappop(held)
            try:
                os.write(dst, pkt)
            except OSError:
                pass  # the destination went down: the packet is lost, as on a wire
        # select takes a timeout in microseconds (epoll and poll in milliseconds)
        ready, _, _ = select.select(by_fd, [], [], (held[0][0] - now) if held else 1.0)
        now = time.monotonic()
        for fd in ready:
            while True:
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if len(pkt) >= 20 and pkt[0] >> 4 == 4 and pkt[16:20] in fds:
                    seq += 1
                    heapq.heappush(held, (now + delay_s, seq, fds[pkt[16:20]], pkt))


def echo(a: str, b: str, b_ip: str, n: int = 200) -> dict:
    """Median round trip of ``n`` 32-byte UDP datagrams from namespace ``a`` to an echo in
    ``b`` (each one after the last came back)."""
    server = subprocess.Popen(["nsenter", f"--net={ns_path(b)}", "--", sys.executable, "-c",
                               "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                               "s.bind(('0.0.0.0',9999))\nprint('up',flush=True)\n"
                               "while True:\n d,a=s.recvfrom(64)\n s.sendto(d,a)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        home = os.open("/proc/self/ns/net", os.O_RDONLY)
        setns(ns_path(a))
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _libc.setns(home, CLONE_NEWNET)
        os.close(home)
        s.settimeout(1.0)
        rtts = []
        for i in range(n):
            t0 = time.perf_counter()
            s.sendto(struct.pack("!I28x", i), (b_ip, 9999))
            try:
                while struct.unpack("!I", s.recv(64)[:4])[0] != i:
                    pass
            except socket.timeout:
                continue
            rtts.append(time.perf_counter() - t0)
        rtts.sort()
        return {"n": len(rtts), "sent": n, "median_ms": statistics.median(rtts) * 1e3,
                "p10_ms": rtts[len(rtts) // 10] * 1e3, "p90_ms": rtts[len(rtts) * 9 // 10] * 1e3}
    finally:
        server.kill()
        server.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--echo", nargs=3, metavar=("A", "B", "B_IP"))
    ap.add_argument("ends", nargs="*", help="WHO:IP (WHO = self or a process id)")
    a = ap.parse_args()
    if a.echo:
        print(json.dumps(echo(*a.echo)), flush=True)
        return
    fds = {}
    for end in a.ends:
        who, ip = end.split(":")
        fds[socket.inet_aton(ip)] = open_tun(who, ip)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        prio = "SCHED_FIFO 10"
    except OSError as e:
        prio = f"normal scheduling (SCHED_FIFO refused: {e.strerror})"
    print(f"READY {len(fds)} namespaces, {a.delay_ms} ms each way, {prio}", flush=True)
    forward(fds, a.delay_ms / 1e3)


if __name__ == "__main__":
    main()
