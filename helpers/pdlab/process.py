"""Process hygiene for live servers: start in a new process group, stop the whole group, by PID.

Every process started through :func:`spawn` runs in its own session (``start_new_session``), so
its process group id equals its PID and holds every child it forks (vLLM's engine core, its
workers). :meth:`ManagedProcess.stop` sends SIGTERM to that group, waits, then SIGKILL: nothing
started here outlives it. A registry stops whatever is still running at interpreter exit
(``atexit``) and on SIGTERM/SIGHUP; on Linux a child also gets SIGTERM if its parent dies
(``PR_SET_PDEATHSIG``). Only processes started here are ever signalled.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "ManagedProcess",
    "PortInUseError",
    "ServerStartError",
    "spawn",
    "stop_all",
    "live_processes",
    "check_port_free",
    "ephemeral_ports",
    "free_port",
    "tail",
    "parse_cpu_list",
    "pin_threads",
    "thread_ids",
    "pinned",
    "listening_sockets",
    "wait_http_ok",
]


class PortInUseError(RuntimeError):
    """A port this server needs on 127.0.0.1 is taken by another process."""


class ServerStartError(RuntimeError):
    """A server exited or did not become healthy in time; the message holds its log's tail."""


_REGISTRY: dict[int, ManagedProcess] = {}
_LOCK = threading.Lock()
_HOOKS_INSTALLED = False


def tail(path: str | Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def check_port_free(port: int, host: str = "127.0.0.1", what: str = "server") -> None:
    """Raise :class:`PortInUseError` if ``host:port`` cannot be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers (uvicorn, aiohttp) set SO_REUSEADDR, so TIME_WAIT leftovers do not block them;
        # only a live listener does. Check the same way.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUseError(f"port {port} on {host} is already in use; the {what} cannot start there. "
                                     f"Stop what holds it (`ss -ltnp 'sport = :{port}'`) or pick another port.") from exc
            raise


def ephemeral_ports() -> range:
    """The kernel's ephemeral TCP port range: where ``bind(port 0)`` and every outgoing connection take
    their local port (``/proc/sys/net/ipv4/ip_local_port_range``; Linux's default 32768-60999 elsewhere)."""
    try:
        lo, hi = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    return range(lo, hi + 1)


def _bindable(port: int, host: str) -> bool:
    try:
        check_port_free(port, host)
    except PortInUseError:
        return False
    return True


def free_port(host: str = "127.0.0.1", count: int = 1, *, lowest: int = 10000, tries: int = 500) -> int:
    """The first of ``count`` consecutive TCP ports that are free on ``host`` right now.

    The block lies outside the kernel's :func:`ephemeral_ports`, at or above ``lowest``: a port the OS
    picked with ``bind(0)`` is an ephemeral one, and a server started between the pick and the bind
    (a vLLM engine's ZMQ sockets, any outgoing connection) can take it first. Chosen at random, so two
    callers rarely pick the same block. RuntimeError when ``tries`` random blocks were all taken.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    eph = ephemeral_ports()
    starts = [*range(lowest, eph.start - count + 1), *range(max(lowest, eph.stop), 65536 - count + 1)]
    if not starts:
        raise RuntimeError(f"no block of {count} ports at or above {lowest} lies outside the ephemeral range "
                           f"{eph.start}-{eph.stop - 1}")
    rng = random.SystemRandom()
    for _ in range(tries):
        first = rng.choice(starts)
        if all(_bindable(port, host) for port in range(first, first + count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports on {host} outside the ephemeral range "
                       f"{eph.start}-{eph.stop - 1} after {tries} tries")


def _pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def parse_cpu_list(spec: str) -> set[int]:
    """CPU ids of a list such as ``"0"``, ``"0-1"`` or ``"0,2-3"`` (the ``taskset -c`` syntax)."""
    cpus: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(f"bad CPU list {spec!r}: use forms like 0, 0-1 or 0,2-3") from None
    if not cpus:
        raise ValueError(f"empty CPU list {spec!r}")
    return cpus


def thread_ids(pid: int) -> list[int]:
    """The thread IDs of process ``pid`` (Linux ``/proc/PID/task``); empty when it has gone."""
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return []


def pin_threads(pids: Sequence[int], cpus: set[int]) -> int:
    """Set the CPU affinity of every thread of each process in ``pids`` to ``cpus`` (Linux).

    Only the processes named, not their children. Threads a process starts later inherit the
    affinity of the thread that starts them. Returns how many threads were pinned; a thread or
    process that has gone is skipped.
    """
    n = 0
    for pid in pids:
        for tid in thread_ids(pid):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)
                n += 1
    return n


@contextlib.contextmanager
def pinned(pids: Sequence[int], cpus: set[int]):
    """Pin every thread of ``pids`` to ``cpus`` while the block runs, then give each process back
    the affinity it had (as a whole: threads started inside the block are restored too)."""
    before = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            before[pid] = os.sched_getaffinity(pid)
    pin_threads(list(before), cpus)
    try:
        yield
    finally:
        for pid, old in before.items():
            pin_threads([pid], old)


class ManagedProcess:
    """A child process in its own process group, logging to a file; stop it with :meth:`stop`."""

    def __init__(self, name: str, popen: subprocess.Popen, log_path: Path):
        self.name = name
        self.popen = popen
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, lines: int = 30) -> str:
        return tail(self.log_path, lines)

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)  # pgid == pid: the group this module created

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM the process group, wait up to ``timeout_s``, then SIGKILL it. Idempotent."""
        if self.popen.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        # Children of the group may outlive the leader: always finish the group off.
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        with _LOCK:
            _REGISTRY.pop(self.pid, None)
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL the whole group now (fault injection); the registry entry stays until :meth:`stop`."""
        self._signal_group(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP the whole group (fault injection: a frozen server); :meth:`resume` continues it."""
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the whole group."""
        self._signal_group(signal.SIGCONT)

    def group_members(self) -> list[int]:
        """PIDs of live (not zombie) processes still in this process's group, from ``/proc``."""
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == self.pid:
                out.append(int(entry))
        return sorted(out)

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive() else f"exited {self.returncode}"
        return f"<ManagedProcess {self.name} pid={self.pid} {state} log={self.log_path}>"


def stop_all() -> None:
    """Stop every process this module started that is still registered."""
    with _LOCK:
        procs = list(_REGISTRY.values())
    for proc in procs:
        proc.stop(timeout_s=5)


def live_processes() -> list[ManagedProcess]:
    """Registered processes (started here and not yet stopped)."""
    with _LOCK:
        return list(_REGISTRY.values())


def _on_signal(signum, frame):  # pragma: no cover - exercised through subprocess tests
    stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    global _HOOKS_INSTALLED
    if _HOOKS_INSTALLED:
        return
    _HOOKS_INSTALLED = True
    atexit.register(stop_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    signal.signal(sig, _on_signal)


def spawn(name: str, argv: Sequence[str], log_path: str | Path, *, env: Mapping[str, str] | None = None,
          cwd: str | Path | None = None, stdin: int | None = subprocess.DEVNULL,
          pass_fds: Sequence[int] = (), cpus: str | None = None) -> ManagedProcess:
    """Start ``argv`` in a new process group with stdout+stderr to ``log_path``; register it.

    ``cpus`` (Linux, e.g. ``"0"`` or ``"0-1"``): the child and everything it starts run on those
    cores only (affinity set between fork and exec, so its children inherit it).

    ``stdin``: ``subprocess.DEVNULL`` (default) or ``subprocess.PIPE`` (then write to
    ``proc.popen.stdin``; :meth:`ManagedProcess.stop` closes it). ``pass_fds``: file descriptors
    the child inherits (for example the write end of a report pipe).
    """
    _install_hooks()
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    full_env.update(env or {})
    linux = sys.platform.startswith("linux")
    allowed = parse_cpu_list(cpus) if cpus and linux else None
    if allowed is not None and not allowed <= os.sched_getaffinity(0):
        raise ValueError(f"{name}: cores {cpus} are not all available here (have {sorted(os.sched_getaffinity(0))})")

    def preexec() -> None:  # runs in the child between fork and exec
        _pdeathsig()
        if allowed is not None:
            os.sched_setaffinity(0, allowed)

    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        popen = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=stdin,
                                 env=full_env, cwd=cwd, start_new_session=True, pass_fds=tuple(pass_fds),
                                 preexec_fn=preexec if linux else None)
    proc = ManagedProcess(name, popen, log_path)
    with _LOCK:
        _REGISTRY[proc.pid] = proc
    return proc


def wait_http_ok(proc: ManagedProcess, url: str, timeout_s: float, *, poll_s: float = 0.5) -> float:
    """Poll ``url`` until it answers 200; return seconds waited.

    Raises :class:`ServerStartError` (with the log's tail) if the process exits or the time runs out.
    """
    import urllib.error
    import urllib.request

    start = time.monotonic()
    while True:
        if not proc.alive():
            raise ServerStartError(f"{proc.name} exited with status {proc.returncode} before {url} answered. "
                                   f"Log {proc.log_path}, last lines:\n{proc.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() - start > timeout_s:
            raise ServerStartError(f"{proc.name} did not answer {url} within {timeout_s:.0f} s. "
                                   f"Log {proc.log_path}, last lines:\n{proc.log_tail()}")
        time.sleep(poll_s)


def listening_sockets(root_pids: Sequence[int]) -> list[tuple[int, str, str, int]]:
    """``(pid, process name, address, port)`` of every TCP/UDP socket listening (or bound, UDP)
    in the process trees under ``root_pids`` (psutil; Linux needs no privileges for own processes)."""
    import psutil

    pids: set[int] = set()
    for root in root_pids:
        try:
            proc = psutil.Process(root)
            pids.update([proc.pid, *(c.pid for c in proc.children(recursive=True))])
        except psutil.NoSuchProcess:
            continue
    out = []
    for pid in sorted(pids):
        try:
            proc = psutil.Process(pid)
            conns = proc.net_connections(kind="inet")
            name = proc.name()
        except psutil.NoSuchProcess:
            continue
        for c in conns:
            listening = c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr)  # SOCK_DGRAM, unconnected
            if listening and c.laddr:
                out.append((pid, name, c.laddr.ip, c.laddr.port))
    return out
