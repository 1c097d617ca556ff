"""What the processes of a deployment cost in CPU time, idle or under load (psutil).

A benchmark of a server on a shared machine measures everything else the machine was doing.
These helpers read the CPU time (user + system, seconds) of every process in a process tree —
the server's Python front end, its ``VLLM::EngineCore`` and ``VLLM::Worker`` children — over a
window, and report it as a fraction of one core (``1.0`` = one core busy the whole window).
:func:`busiest_threads` names the threads behind it (``/proc/PID/task/TID/comm``), which is how
the course found NIXL's progress thread polling with a zero timeout (docs/LIVE_LABS.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

__all__ = ["ProcessCPU", "ThreadCPU", "tree_cpu_seconds", "measure_cpu", "busiest_threads", "format_cpu"]


@dataclass(frozen=True)
class ProcessCPU:
    """CPU used by one labelled process tree over ``window_s`` seconds (``cores`` = seconds / window)."""

    label: str
    pid: int
    cpu_s: float
    window_s: float
    processes: int

    @property
    def cores(self) -> float:
        return self.cpu_s / self.window_s if self.window_s > 0 else 0.0


@dataclass(frozen=True)
class ThreadCPU:
    """One thread's CPU over a window: process label, thread id and name, fraction of a core."""

    label: str
    tid: int
    name: str
    cores: float


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) so far of ``pid`` and each live descendant, by PID."""
    out: dict[int, float] = {}
    for proc in _tree(pid):
        try:
            t = proc.cpu_times()
            out[proc.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return out


def measure_cpu(roots: Mapping[str, int], window_s: float = 10.0, *, per_process: bool = False) -> list[ProcessCPU]:
    """CPU of each labelled process tree over the next ``window_s`` seconds (blocks that long).

    A process that starts or ends inside the window counts from or until then (its CPU before
    the window is not charged to it). ``per_process``: one row per process of each tree,
    labelled ``"<label>/<process name>"``, instead of one row per tree.
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    before = {label: tree_cpu_seconds(pid) for label, pid in roots.items()}
    t0 = time.monotonic()
    time.sleep(window_s)
    after = {label: tree_cpu_seconds(pid) for label, pid in roots.items()}
    elapsed = time.monotonic() - t0
    rows = []
    for label, pid in roots.items():
        if per_process:
            for p, cpu in after[label].items():
                rows.append(ProcessCPU(f"{label}/{_name(p)}", p, max(cpu - before[label].get(p, 0.0), 0.0), elapsed, 1))
            continue
        used = sum(cpu - before[label].get(p, 0.0) for p, cpu in after[label].items())
        rows.append(ProcessCPU(label, pid, max(used, 0.0), elapsed, len(after[label])))
    return rows


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return "?"


def _thread_times(pid: int) -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    for proc in _tree(pid):
        try:
            threads = proc.threads()
        except psutil.NoSuchProcess:
            continue
        for th in threads:
            try:
                with open(f"/proc/{proc.pid}/task/{th.id}/comm") as fh:
                    name = fh.read().strip()
            except OSError:
                name = "?"
            out[th.id] = (name, th.user_time + th.system_time)
    return out


def busiest_threads(roots: Mapping[str, int], window_s: float = 3.0, top: int = 5) -> list[ThreadCPU]:
    """The ``top`` threads by CPU over the next ``window_s`` seconds, across all trees (Linux)."""
    before = {label: _thread_times(pid) for label, pid in roots.items()}
    t0 = time.monotonic()
    time.sleep(window_s)
    after = {label: _thread_times(pid) for label, pid in roots.items()}
    elapsed = time.monotonic() - t0
    rows = [ThreadCPU(label, tid, name, (cpu - before[label].get(tid, (name, 0.0))[1]) / elapsed)
            for label, threads in after.items() for tid, (name, cpu) in threads.items()]
    return sorted(rows, key=lambda r: -r.cores)[:top]


def format_cpu(rows: list[ProcessCPU], title: str = "CPU") -> str:
    """A small text table: label, processes, fraction of one core."""
    lines = [f"{title} (fraction of one core over {rows[0].window_s:.1f} s)" if rows else title]
    lines += [f"  {r.label:<24} {r.processes:>3} procs  {r.cores:6.3f} cores" for r in rows]
    return "\n".join(lines)
