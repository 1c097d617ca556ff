"""Unit tests of the live-serving hygiene helpers: CPU cost, core pinning, listening sockets,
the NIXL connector settings and the TTFT breakdown arithmetic (no engine started)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from pdlab.process import listening_sockets, parse_cpu_list, pin_threads, pinned, spawn
from pdlab.serve.engines.vllm import CPU_NIXL_PROGRESS_DELAY_US, VLLMServerSpec, kv_transfer_config
from pdlab.serve.measure.cpucost import (
    busiest_threads,
    format_cpu,
    machine_cpu_seconds,
    measure_cpu,
    own_cpu_seconds,
)
from pdlab.serve.measure.evidence import MetricsSnapshot
from pdlab.serve.measure.ttft import (
    COLOCATED_PARTS,
    DISAGG_PARTS,
    EngineTimes,
    colocated_breakdown,
    combine_breakdowns,
    disaggregated_breakdown,
    engine_times,
)

BUSY = "import time\nprint('ready', flush=True)\nt=time.time()\nwhile time.time()-t<30: pass\n"
IDLE = "import time\nprint('ready', flush=True)\ntime.sleep(30)\n"


def _child(code: str) -> subprocess.Popen:
    """A child interpreter, returned once it has started (its first line is ``ready``)."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_measure_cpu_tells_a_spinning_process_from_a_sleeping_one():
    busy, idle = _child(BUSY), _child(IDLE)  # both past the interpreters' start-up
    try:
        rows = {r.label: r for r in measure_cpu({"busy": busy.pid, "idle": idle.pid}, 1.5)}
        # the busy child may share the cores with other work: ask for a clear margin, not a full core
        assert rows["busy"].cores > 0.03 and rows["busy"].cores > 5 * rows["idle"].cores, rows
        assert rows["idle"].cores < 0.05, rows
        assert "busy" in format_cpu(list(rows.values()))
        per = measure_cpu({"busy": busy.pid}, 0.5, per_process=True)
        assert len(per) == 1 and per[0].label.startswith("busy/")
        top = busiest_threads({"busy": busy.pid, "idle": idle.pid}, 0.5, top=1)
        assert top[0].label == "busy" and top[0].cores > 0.02
    finally:
        busy.kill(), idle.kill()
        busy.wait(), idle.wait()
    with pytest.raises(ValueError, match="window_s"):
        measure_cpu({}, 0)


def test_own_and_machine_cpu_seconds_count_a_spinning_child():
    """own_cpu_seconds counts exactly the given processes (a parent without its spinning child);
    the machine's busy seconds grow by at least what the child spun; a vanished PID counts 0."""
    busy = _child(BUSY)
    try:
        me, machine0 = own_cpu_seconds([os.getpid()]), machine_cpu_seconds()
        child0 = own_cpu_seconds([busy.pid])
        time.sleep(1.0)
        spun = own_cpu_seconds([busy.pid]) - child0
        busy1, steal1 = machine_cpu_seconds()
        assert spun > 0.03
        assert own_cpu_seconds([os.getpid()]) - me < spun          # the sleeping parent, children excluded
        assert busy1 - machine0[0] >= 0.5 * spun and steal1 >= machine0[1] >= 0
    finally:
        busy.kill()
        busy.wait()
    assert own_cpu_seconds([busy.pid]) == 0.0


@pytest.mark.parametrize("spec, cpus", [("0", {0}), ("0-1", {0, 1}), ("0,2-3", {0, 2, 3})])
def test_parse_cpu_list(spec, cpus):
    assert parse_cpu_list(spec) == cpus


@pytest.mark.parametrize("spec", ["", "a", "1-x"])
def test_parse_cpu_list_rejects_bad_lists(spec):
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpu_list(spec)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="Linux with two or more cores")
def test_pinned_pins_every_thread_of_a_process_and_gives_its_affinity_back():
    """A thread started before the block and one started inside it both run on the one core while
    the block runs; afterwards every thread has the process's old affinity."""
    import threading

    old = os.sched_getaffinity(0)
    one = {min(old)}
    seen: dict[str, set] = {}
    stop = threading.Event()

    def worker(name):
        seen[name] = set()
        while not stop.is_set():
            seen[name] = os.sched_getaffinity(0)
            time.sleep(0.01)

    early = threading.Thread(target=worker, args=("early",), daemon=True)
    early.start()
    try:
        with pinned([os.getpid()], one):
            late = threading.Thread(target=worker, args=("late",), daemon=True)
            late.start()
            time.sleep(0.1)
            assert os.sched_getaffinity(0) == one and seen["early"] == one and seen["late"] == one
        time.sleep(0.1)
        assert os.sched_getaffinity(0) == old and seen["early"] == old and seen["late"] == old
    finally:
        stop.set()
        os.sched_setaffinity(0, old)
    assert pin_threads([2 ** 22 + 1], one) == 0   # a PID that does not exist: nothing pinned, no error


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_spawn_pins_the_child_and_its_children(tmp_path):
    core = str(min(os.sched_getaffinity(0)))
    code = ("import os, subprocess, sys\nprint(sorted(os.sched_getaffinity(0)), flush=True)\n"
            "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'])\n")
    proc = spawn("pin-test", [sys.executable, "-c", code], tmp_path / "pin.log", cpus=core)
    try:
        proc.popen.wait(timeout=30)
    finally:
        proc.stop()  # leaves the registry: later tests assert nothing of theirs is left
    lines = (tmp_path / "pin.log").read_text().splitlines()[-2:]  # after the logged command line
    assert lines == [f"[{core}]", f"[{core}]"], lines
    with pytest.raises(ValueError, match="not all available"):
        spawn("pin-bad", [sys.executable, "-c", "pass"], tmp_path / "bad.log", cpus="4096")


def test_listening_sockets_reports_address_and_port(tmp_path):
    code = ("import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True); time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        deadline = time.monotonic() + 5
        socks = []
        while time.monotonic() < deadline and not socks:
            socks = listening_sockets([proc.pid])
        assert (proc.pid, socks[0][1], "127.0.0.1", port) in socks
    finally:
        proc.kill()
        proc.wait()


def test_nixl_config_paces_the_progress_thread_on_cpu_only():
    cfg = kv_transfer_config("nixl", "decode", nixl_progress_delay_us=500)
    assert cfg["kv_connector"] == "NixlConnector"
    assert cfg["kv_connector_module_path"] == "pdlab.serve.engines.nixl_connector"
    assert cfg["kv_connector_extra_config"] == {"progress_thread_delay_us": 500}
    assert "kv_connector_module_path" not in kv_transfer_config("nixl", "decode")
    with pytest.raises(ValueError, match=">= 0"):
        kv_transfer_config("nixl", "decode", nixl_progress_delay_us=-5)
    assert VLLMServerSpec("m", role="decode", device="cpu").resolved_nixl_delay_us() == CPU_NIXL_PROGRESS_DELAY_US
    assert VLLMServerSpec("m", role="decode", device="cuda").resolved_nixl_delay_us() is None
    assert VLLMServerSpec("m", role="decode", device="cpu", nixl_progress_delay_us=-1).resolved_nixl_delay_us() is None
    argv = VLLMServerSpec("m", role="prefill", device="cpu").argv()
    assert "pdlab.serve.engines.nixl_connector" in argv[argv.index("--kv-transfer-config") + 1]


def _snapshot(**means) -> MetricsSnapshot:
    lines = []
    for name, value in means.items():
        lines += [f"vllm:{name}_seconds_sum {value}", f"vllm:{name}_seconds_count 1"]
    return MetricsSnapshot.from_text("\n".join(lines))


def test_engine_times_are_means_of_histogram_deltas():
    before = MetricsSnapshot.from_text("vllm:request_queue_time_seconds_sum 1.0\nvllm:request_queue_time_seconds_count 2")
    after = MetricsSnapshot.from_text("vllm:request_queue_time_seconds_sum 1.6\nvllm:request_queue_time_seconds_count 4\n"
                                      "vllm:nixl_xfer_time_seconds_sum 0.01\nvllm:nixl_xfer_time_seconds_count 2")
    t = engine_times(before, after)
    assert t.requests == 2 and t.queue_s == pytest.approx(0.3)
    assert t.kv_transfer_s == pytest.approx(0.005) and t.kv_transfers == 2
    assert engine_times(after, after).queue_s == 0.0
    assert engine_times(MetricsSnapshot(()), _snapshot(request_prefill_time=0.2)).prefill_s == pytest.approx(0.2)


def test_disaggregated_breakdown_adds_up_and_flags_a_missing_part():
    prefill = EngineTimes(1, queue_s=0.010, prefill_s=0.080, decode_s=0.0, ttft_s=0.092, e2e_s=0.092,
                          kv_transfer_s=0.0, kv_transfers=0)
    decode = EngineTimes(1, queue_s=0.002, prefill_s=0.015, decode_s=0.2, ttft_s=0.018, e2e_s=0.3,
                         kv_transfer_s=0.005, kv_transfers=1)
    proxy = {"own_s": 0.001, "prefill_leg_s": 0.100, "decode_first_s": 0.025}
    b = disaggregated_breakdown(prefill, decode, proxy, client_ttft_s=0.128)
    assert tuple(b.parts) == DISAGG_PARTS
    assert b.accounted_s == pytest.approx(0.126)
    assert b.parts["prefill front end"] == pytest.approx(0.010)
    assert b.parts["decode first step"] == pytest.approx(0.010)
    assert b.consistent and abs(b.rel_gap) < 0.02
    assert sum(r["ms"] for r in b.rows()) == pytest.approx(126.0)
    # a client that waited much longer than the proxy saw: something unaccounted for
    assert not disaggregated_breakdown(prefill, decode, proxy, client_ttft_s=0.200).consistent
    # a short TTFT: 8 ms unaccounted is 12 % of it but within the client-proxy hop's slack; 12 ms is not
    short = dict(prefill=EngineTimes(1, 0.0, 0.032, 0.0, 0.033, 0.033, 0.0, 0), decode=decode,
                 proxy={"own_s": 0.0, "prefill_leg_s": 0.040, "decode_first_s": 0.025})
    assert disaggregated_breakdown(**short, client_ttft_s=0.073).consistent
    assert not disaggregated_breakdown(**short, client_ttft_s=0.077).consistent
    # an engine time longer than the proxy's leg around it: clocks disagree
    slow = EngineTimes(1, 0.010, 0.150, 0.0, 0.16, 0.16, 0.0, 0)
    assert not disaggregated_breakdown(slow, decode, proxy, client_ttft_s=0.128).consistent


def test_colocated_breakdown_parts():
    server = EngineTimes(1, queue_s=0.004, prefill_s=0.040, decode_s=0.3, ttft_s=0.050, e2e_s=0.35,
                         kv_transfer_s=0.0, kv_transfers=0)
    b = colocated_breakdown(server, client_ttft_s=0.055)
    assert tuple(b.parts) == COLOCATED_PARTS
    assert b.parts["front end"] == pytest.approx(0.005) and b.parts["engine overhead"] == pytest.approx(0.006)
    assert b.accounted_s == pytest.approx(0.055) and b.consistent


def test_breakdowns_of_one_run_in_blocks_combine_weighted_by_requests():
    def block(queue_s: float, client_s: float):
        return colocated_breakdown(EngineTimes(1, queue_s=queue_s, prefill_s=0.040, decode_s=0.3, ttft_s=0.040 + queue_s,
                                               e2e_s=0.35, kv_transfer_s=0.0, kv_transfers=0), client_ttft_s=client_s)
    # 30 requests with 10 ms of queue, 10 with 50 ms: the run's mean queue is (30·10 + 10·50) / 40 = 20 ms
    whole = combine_breakdowns([block(0.010, 0.055), block(0.050, 0.095)], [30, 10])
    assert whole.parts["queue"] == pytest.approx(0.020) and whole.client_ttft_s == pytest.approx(0.065)
    assert whole.accounted_s == pytest.approx(whole.client_ttft_s) and tuple(whole.parts) == COLOCATED_PARTS
    with pytest.raises(ValueError, match="positive total weight"):
        combine_breakdowns([block(0.01, 0.05)], [0])
    proxy = {"own_s": 0.001, "prefill_leg_s": 0.05, "decode_first_s": 0.02, "ttft_s": 0.07}
    pair = disaggregated_breakdown(EngineTimes(1, 0.0, 0.04, 0.0, 0.04, 0.04, 0.0, 0),
                                   EngineTimes(1, 0.0, 0.01, 0.1, 0.01, 0.1, 0.002, 1), proxy, client_ttft_s=0.07)
    with pytest.raises(ValueError, match="same parts"):
        combine_breakdowns([block(0.01, 0.05), pair], [1, 1])
