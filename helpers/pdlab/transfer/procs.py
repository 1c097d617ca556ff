"""Process hygiene for transfer benchmarks: start peers, read their reports, always stop them.

Every process is started in its own session (process group = its PID), so stopping it also
ends anything it started (for example the ``multiprocessing`` resource tracker of ``shm``).
Only those groups are signalled, by PID; logs go to ``build/transfer-logs/``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pdlab.paths import build_dir

__all__ = ["ManagedProcess", "PeerProcess", "log_dir", "PeerError"]


class PeerError(RuntimeError):
    """A peer process failed or timed out; the message carries its error and log path."""


def log_dir() -> Path:
    """``build/transfer-logs/`` (created on use)."""
    path = build_dir() / "transfer-logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


class ManagedProcess:
    """A child process in its own session, logged to a file, stopped (TERM, then KILL) on exit."""

    def __init__(self, cmd: list[str], log_name: str, *, env: dict[str, str] | None = None,
                 stdin: int | None = None, pass_fds: tuple[int, ...] = ()):
        self.log_path = log_dir() / f"{log_name}.log"
        self._log = open(self.log_path, "wb")
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        try:
            self.proc = subprocess.Popen(cmd, stdin=stdin, stdout=self._log, stderr=subprocess.STDOUT,
                                         env=full_env, pass_fds=pass_fds, start_new_session=True)
        except BaseException:
            self._log.close()
            raise
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n_chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # the group we created: this process and its own children
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace_s: float = 5.0) -> int | None:
        """End the process and its group; return its exit status."""
        if self.alive():
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait(grace_s)
        # stragglers in the group (e.g. a resource tracker) go too
        self._signal_group(signal.SIGKILL)
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class PeerProcess(ManagedProcess):
    """A :mod:`pdlab.transfer.peer` process: JSON plan on stdin, JSON reports on a pipe."""

    def __init__(self, role: str, transport: str, *, host: str = "127.0.0.1", netns: str | None = None,
                 corrupt: bool = False, env: dict[str, str] | None = None, log_name: str = "peer"):
        read_fd, write_fd = os.pipe()
        cmd = [sys.executable, "-m", "pdlab.transfer.peer", "--role", role, "--transport", transport,
               "--host", host, "--report-fd", str(write_fd)]
        if corrupt:
            cmd.append("--corrupt")
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.role = role
        try:
            super().__init__(cmd, log_name, env=env, stdin=subprocess.PIPE, pass_fds=(write_fd,))
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.reports: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(read_fd,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as fh:
            for line in fh:
                try:
                    self.reports.put(json.loads(line))
                except json.JSONDecodeError:
                    continue
        self.reports.put(None)  # EOF: the process has gone

    def send_line(self, payload: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(payload) + "\n").encode())
        self.proc.stdin.flush()

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
            self.proc.wait(5)
            raise PeerError(f"{self.role} peer exited ({self.proc.returncode}) without finishing "
                            f"(log: {self.log_path})\n{self.log_tail()}")
        if msg.get("type") == "error":
            raise PeerError(f"{self.role} peer failed: {msg['message']} (log: {self.log_path})\n"
                            f"{msg.get('traceback', '')}")
        return msg
