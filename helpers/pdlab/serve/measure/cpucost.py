"""What the processes of a deployment cost in CPU time, idle or under load (psutil).

A benchmark of a server on a shared machine measures everything else the machine was doing.
These helpers read the CPU time (user + system, seconds) of every process in a process tree —
the server's Python front end, its ``VLLM::EngineCore`` and ``VLLM::Worker`` children — over a
window, and report it as a fraction of one core (``1.0`` = one core busy the whole window).
:func:`busiest_threads` names the threads behind it (``/proc/PID/task/TID/comm``), which is how
the course found NIXL's progress thread polling with a zero timeout (docs/LIVE_LABS.md).
:func:`own_cpu_seconds` counts given processes without their children (front ends without their
engines); :func:`machine_cpu_seconds` the whole machine's busy time and the time its hypervisor
took (steal).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

__all__ = ["CPUMeter", "CPUSampler", "ProcessCPU", "ThreadCPU", "tree_processes", "tree_cpu_seconds", "own_cpu_seconds",
           "machine_cpu_seconds", "measure_cpu", "busiest_threads", "thread_times", "thread_deltas", "format_cpu",
           "nixl_agent_idle_cpu"]


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


def tree_processes(pid: int) -> list[psutil.Process]:
    """``pid`` and its live descendants (empty when ``pid`` is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) so far of ``pid`` and each live descendant, by PID."""
    out: dict[int, float] = {}
    for proc in tree_processes(pid):
        try:
            t = proc.cpu_times()
            out[proc.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return out


def own_cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds (user + system) so far of exactly ``pids``, all their threads and none of their
    child processes (a vLLM API server without its engine core); a process that is gone counts 0."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, steal) CPU seconds so far of the whole machine, all cores (``/proc/stat``): busy =
    user + nice + system + irq + softirq; steal = time the hypervisor ran something else on this
    machine's virtual CPUs. Differences over a run tell what else the machine was doing; (0, 0)
    where ``/proc/stat`` does not exist."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields + [0] * (8 - len(fields))
    return (user + nice + system + irq + softirq) / tick, steal / tick


class CPUSampler:
    """The CPU seconds of ``pids`` (:func:`own_cpu_seconds`) sampled every ``period_s`` seconds by a
    background thread while the block runs: ``samples`` = [(``time.perf_counter()``, CPU seconds so
    far)], one at the start and one at the end included; the benchmark client's records use the
    same clock, so a run's CPU can be split by what its requests did when
    (:func:`pdlab.simreal.runfit.split_co_runner_cpu`). One sample costs about a millisecond
    of the calling process's CPU per process read."""

    def __init__(self, pids: Iterable[int], *, period_s: float = 0.5):
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.pids, self.period_s = list(pids), period_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pdlab-cpu-sampler", daemon=True)

    def _sample(self) -> None:
        self.samples.append((time.perf_counter(), own_cpu_seconds(self.pids)))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def __enter__(self) -> CPUSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


class CPUMeter:
    """CPU of labelled process trees between ``__enter__`` and ``__exit__`` (``rows`` afterwards).

    ``with CPUMeter({"decode": pid}) as meter: run_bench(...)`` → ``meter.rows``: the cost of the
    run, per tree or (``per_process``) per process labelled ``"<label>/<process name>"``. A
    process that starts or ends inside the window counts from or until then.
    """

    def __init__(self, roots: Mapping[str, int], *, per_process: bool = False):
        self.roots = dict(roots)
        self.per_process = per_process
        self.rows: list[ProcessCPU] = []
        self._before: dict[str, dict[int, float]] = {}
        self._t0 = 0.0

    def __enter__(self) -> CPUMeter:
        self._before = {label: tree_cpu_seconds(pid) for label, pid in self.roots.items()}
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        after = {label: tree_cpu_seconds(pid) for label, pid in self.roots.items()}
        elapsed = time.monotonic() - self._t0
        rows = []
        for label, pid in self.roots.items():
            before = self._before[label]
            if self.per_process:
                rows += [ProcessCPU(f"{label}/{_name(p)}", p, max(cpu - before.get(p, 0.0), 0.0), elapsed, 1)
                         for p, cpu in after[label].items()]
            else:
                used = sum(cpu - before.get(p, 0.0) for p, cpu in after[label].items())
                rows.append(ProcessCPU(label, pid, max(used, 0.0), elapsed, len(after[label])))
        self.rows = rows


def measure_cpu(roots: Mapping[str, int], window_s: float = 10.0, *, per_process: bool = False) -> list[ProcessCPU]:
    """CPU of each labelled process tree over the next ``window_s`` seconds (blocks that long).

    ``per_process``: one row per process of each tree instead of one per tree (see :class:`CPUMeter`).
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    with CPUMeter(roots, per_process=per_process) as meter:
        time.sleep(window_s)
    return meter.rows


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return "?"


def _thread_times(pid: int, tree: bool = True) -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    if tree:
        procs = tree_processes(pid)
    else:
        try:
            procs = [psutil.Process(pid)]
        except psutil.NoSuchProcess:
            procs = []
    for proc in procs:
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


def thread_times(roots: Mapping[str, int], *, alone: Iterable[str] = ()) -> dict[str, dict[int, tuple[str, float]]]:
    """Per label of ``roots``: each thread of the process tree, ``{tid: (name, CPU seconds so far)}``
    (Linux); for the labels in ``alone``, of the root process only (a client that started the servers
    would otherwise count their threads too)."""
    alone = set(alone)
    return {label: _thread_times(pid, tree=label not in alone) for label, pid in roots.items()}


def thread_deltas(before: Mapping[str, Mapping[int, tuple[str, float]]],
                  after: Mapping[str, Mapping[int, tuple[str, float]]], elapsed_s: float) -> list[ThreadCPU]:
    """Every thread's CPU between two :func:`thread_times` snapshots ``elapsed_s`` apart, busiest first
    (a thread born in between counts from 0)."""
    rows = [ThreadCPU(label, tid, name, (cpu - before.get(label, {}).get(tid, (name, 0.0))[1]) / elapsed_s)
            for label, threads in after.items() for tid, (name, cpu) in threads.items()]
    return sorted(rows, key=lambda r: -r.cores)


def busiest_threads(roots: Mapping[str, int], window_s: float = 3.0, top: int = 5) -> list[ThreadCPU]:
    """The ``top`` threads by CPU over the next ``window_s`` seconds, across all trees (Linux)."""
    before = thread_times(roots)
    t0 = time.monotonic()
    time.sleep(window_s)
    after = thread_times(roots)
    return thread_deltas(before, after, time.monotonic() - t0)[:top]


def format_cpu(rows: list[ProcessCPU], title: str = "CPU") -> str:
    """A small text table: label, processes, fraction of one core."""
    lines = [f"{title} (fraction of one core over {rows[0].window_s:.1f} s)" if rows else title]
    lines += [f"  {r.label:<24} {r.processes:>3} procs  {r.cores:6.3f} cores" for r in rows]
    return "\n".join(lines)


_AGENT_PROBE = r"""
import os, sys, time
delay = int(sys.argv[1]); window = float(sys.argv[2])
if delay < 0:
    from nixl._api import nixl_agent
else:
    from pdlab.serve.engines.nixl_connector import PacedNixlAgent as nixl_agent
    nixl_agent.progress_delay_us = delay
from nixl._api import nixl_agent_config
agent = nixl_agent("idle-probe", nixl_agent_config(num_threads=4, capture_telemetry=True))  # as vLLM 0.32 builds it
time.sleep(0.5)
c0, w0 = time.process_time(), time.monotonic()
time.sleep(window)
print("CORES", (time.process_time() - c0) / (time.monotonic() - w0), flush=True)
os._exit(0)  # a process that made a UCX agent crashes at interpreter exit
"""


def nixl_agent_idle_cpu(progress_delay_us: int | None, window_s: float = 3.0, timeout_s: float = 180.0) -> float:
    """CPU (fraction of one core) of a bare, idle NIXL agent configured as vLLM's worker makes it.

    ``None``: NIXL's stock agent (progress thread never sleeps); a number: the
    :class:`pdlab.serve.engines.nixl_connector.PacedNixlAgent` the course's CPU servers use. Runs in a
    subprocess (NIXL with UCX must not outlive its interpreter). Raises RuntimeError naming the
    problem if NIXL (or vLLM, for the paced agent) is missing.
    """
    import subprocess
    import sys

    delay = -1 if progress_delay_us is None else int(progress_delay_us)
    out = subprocess.run([sys.executable, "-c", _AGENT_PROBE, str(delay), str(window_s)],
                         capture_output=True, text=True, timeout=timeout_s)
    for line in out.stdout.splitlines():
        if line.startswith("CORES "):
            return float(line.split()[1])
    raise RuntimeError(f"NIXL agent probe failed (exit {out.returncode}): {out.stderr.strip()[-500:]}")
