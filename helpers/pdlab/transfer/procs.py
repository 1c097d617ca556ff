"""Peers of transfer benchmarks: processes that report JSON lines on a pipe, always stopped.

Processes are started and stopped by :func:`pdlab.process.spawn` (the course's one process
supervisor: own process group, stopped by PID with the whole group, registered for clean-up at
exit). This module adds the report pipe: a :class:`ReportingProcess` gets the write end of a pipe
as ``--report-fd N`` and writes one JSON object a line to it; logs go to ``build/transfer-logs/``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from pdlab.paths import build_dir
from pdlab.process import ManagedProcess, spawn

__all__ = ["ReportingProcess", "PeerProcess", "log_dir", "PeerError"]


class PeerError(RuntimeError):
    """A peer process failed or timed out; the message carries its error and log path."""


def log_dir() -> Path:
    """``build/transfer-logs/`` (created on use)."""
    path = build_dir() / "transfer-logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


class ReportingProcess:
    """``argv --report-fd N`` under :func:`~pdlab.process.spawn`: JSON plans on its stdin,
    JSON reports (one a line) read from the pipe into :attr:`reports`; ``None`` marks its end."""

    def __init__(self, role: str, argv: Sequence[str], log_name: str, *, env: dict[str, str] | None = None,
                 netns: str | None = None):
        read_fd, write_fd = os.pipe()
        cmd = [*argv, "--report-fd", str(write_fd)]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.role = role
        try:
            self.process: ManagedProcess = spawn(f"{role}-peer", cmd, log_dir() / f"{log_name}.log",
                                                 env={"PYTHONUNBUFFERED": "1", **(env or {})},
                                                 stdin=subprocess.PIPE, pass_fds=(write_fd,))
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.reports: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(read_fd,), daemon=True)
        self._reader.start()

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def alive(self) -> bool:
        return self.process.alive()

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines)

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """End the process and its group; return its exit status."""
        return self.process.stop(timeout_s)

    def __enter__(self) -> ReportingProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as fh:
            for line in fh:
                try:
                    self.reports.put(json.loads(line))
                except json.JSONDecodeError:
                    continue
        self.reports.put(None)  # EOF: the process has gone

    def send_line(self, payload: dict) -> None:
        stdin = self.process.popen.stdin
        assert stdin is not None
        stdin.write((json.dumps(payload) + "\n").encode())
        stdin.flush()

    def next_report(self, deadline: float) -> dict:
        """The next report, or PeerError when the peer failed, exited or the deadline passed."""
        timeout = deadline - time.monotonic()
        if timeout <= 0:
            raise PeerError(f"{self.role} peer timed out (log: {self.log_path})")
        try:
            msg = self.reports.get(timeout=timeout)
        except queue.Empty:
            raise PeerError(f"{self.role} peer timed out (log: {self.log_path})\n{self.log_tail()}") from None
        if msg is None:
            self.process.popen.wait(5)
            raise PeerError(f"{self.role} peer exited ({self.process.returncode}) without finishing "
                            f"(log: {self.log_path})\n{self.log_tail()}")
        if msg.get("type") == "error":
            raise PeerError(f"{self.role} peer failed: {msg['message']} (log: {self.log_path})\n"
                            f"{msg.get('traceback', '')}")
        return msg


class PeerProcess(ReportingProcess):
    """A :mod:`pdlab.transfer.peer` process (``role`` send or recv over ``transport``)."""

    def __init__(self, role: str, transport: str, *, host: str = "127.0.0.1", netns: str | None = None,
                 corrupt: bool = False, env: dict[str, str] | None = None, log_name: str = "peer"):
        argv = [sys.executable, "-m", "pdlab.transfer.peer", "--role", role, "--transport", transport,
                "--host", host] + (["--corrupt"] if corrupt else [])
        super().__init__(role, argv, log_name, env=env, netns=netns)
