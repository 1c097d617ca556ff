"""Loopback-only network namespaces: contain a transport that listens on every interface.

Mooncake's Transfer Engine (0.3.13) listens on ``0.0.0.0`` (its handshake/RPC port) and on
``::`` (its TCP transport) whatever host it is given, and its ``MC_TCP_BIND_ADDRESS`` does not
change that: measured with ``psutil`` on this course's machine. The course binds everything it
starts to loopback, so such a transport runs its two peers inside a fresh network namespace whose
only interface is ``lo``: what it listens on there is reachable from nowhere else. The namespace
is deleted on every path. Needs root and ``ip`` (iproute2); :func:`namespace_status` says why not.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ALL_INTERFACE_TRANSPORTS", "NamespaceUnavailable", "namespace_status", "loopback_namespace",
           "namespace_interfaces", "namespace_listening"]

#: Transports whose peers listen on every interface, with what was measured.
ALL_INTERFACE_TRANSPORTS: dict[str, str] = {
    "mooncake": "Mooncake Transfer Engine 0.3.13 listens on 0.0.0.0 and :: whatever host it is given",
}

_counter = itertools.count()


class NamespaceUnavailable(RuntimeError):
    """No network namespace can be made here (not root, no iproute2, ...)."""


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def namespace_status() -> tuple[bool, str]:
    """``(possible, reason)``: root, ``ip`` present, and a namespace can be created and deleted."""
    if os.geteuid() != 0:
        return False, "needs root to create a network namespace"
    if shutil.which("ip") is None:
        return False, "`ip` not found: apt-get install iproute2"
    name = f"pdlabprobe{os.getpid()}"
    made = _run("ip", "netns", "add", name)
    if made.returncode != 0:
        return False, f"`ip netns add` failed: {made.stderr.strip()}"
    _run("ip", "netns", "del", name)
    return True, ""


@contextmanager
def loopback_namespace() -> Iterator[str]:
    """A fresh namespace with only ``lo`` (up); yields its name for ``ip netns exec``."""
    ok, why = namespace_status()
    if not ok:
        raise NamespaceUnavailable(why)
    name = f"pdlablo{os.getpid() % 100000}x{next(_counter)}"
    made = _run("ip", "netns", "add", name)
    if made.returncode != 0:
        raise NamespaceUnavailable(f"`ip netns add {name}` failed: {made.stderr.strip()}")
    try:
        up = _run("ip", "-n", name, "link", "set", "lo", "up")
        if up.returncode != 0:
            raise NamespaceUnavailable(f"`ip -n {name} link set lo up` failed: {up.stderr.strip()}")
        yield name
    finally:
        _run("ip", "netns", "del", name)


def namespace_interfaces(pid: int) -> list[str]:
    """Names of the network interfaces that process ``pid`` sees (``/proc/PID/net/dev``)."""
    with open(f"/proc/{pid}/net/dev") as fh:
        lines = fh.read().splitlines()[2:]
    return sorted(line.split(":", 1)[0].strip() for line in lines if ":" in line)


def _hex_address(field: str) -> tuple[str, int]:
    addr, port = field.split(":")
    raw = bytes.fromhex(addr)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def namespace_listening(pid: int) -> list[tuple[str, int]]:
    """``(address, port)`` of every TCP socket listening in the network namespace of process ``pid``.

    Reads ``/proc/PID/net/tcp`` and ``tcp6``, which show the sockets of that process's namespace
    (``psutil`` reads the caller's namespace only).
    """
    out = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as fh:
                rows = fh.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                out.append(_hex_address(fields[1]))
    return sorted(set(out))
