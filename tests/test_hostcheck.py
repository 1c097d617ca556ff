"""pdlab.serve.measure.hostcheck: the bare host's steadiness, measured in a pinned child process."""

import os

import pytest
from pdlab.hardware import machine_type
from pdlab.serve.measure.hostcheck import (
    BAND_SPREAD,
    HostCheck,
    KernelWindows,
    between_checks,
    host_lines,
    measure_host,
)


def _check(core: int, matmul_windows: tuple[float, ...], copy_windows: tuple[float, ...] = (1.0, 1.0)) -> HostCheck:
    return HostCheck(core, 12.0, 2.0, 1.01, 0.0,
                     {"matmul": KernelWindows(1.0, matmul_windows, 100), "copy": KernelWindows(1.0, copy_windows, 100)})


def test_spread_is_the_slowest_over_the_fastest_window_and_the_band_is_plus_minus_ten_percent():
    steady, moving = _check(0, (0.95, 1.0, 1.05)), _check(1, (0.9, 1.3, 1.32))
    assert steady.spread == pytest.approx(1.05 / 0.95) and steady.within_band
    assert moving.spread == pytest.approx(1.32 / 0.9) and not moving.within_band
    assert BAND_SPREAD == pytest.approx(1.1 / 0.9)
    assert list(moving.kernels["matmul"].ratios) == pytest.approx([0.9, 1.3, 1.32])
    assert HostCheck.from_json(moving.to_json()) == moving


def test_host_lines_say_whether_the_host_alone_can_break_the_band():
    assert host_lines([]) == []
    calm = host_lines([_check(0, (0.97, 1.0, 1.03)), _check(1, (0.98, 1.02))])
    assert "up to 1.06×" in calm[0] and "the host was steady" in calm[1]
    assert f"the bare host ({machine_type()};" in calm[0]   # which machine type the verdict is about
    rough = host_lines([_check(0, (0.97, 1.03)), _check(1, (0.86, 1.35), copy_windows=(0.92, 1.08))])
    assert "up to 1.57× (core 1; the 64 MiB copy up to 1.17×)" in rough[0]
    assert rough[1].startswith("1 of 2 check(s) moved more than a ±10 % band holds (1.22×)")
    assert "not idle" not in rough[0]
    crowded = HostCheck(0, 12.0, 2.0, 1.55, 0.0, _check(0, (1.0, 1.5)).kernels)
    assert "the machine was not idle during 1 check(s)" in host_lines([crowded])[0]


def test_measure_host_times_both_kernels_per_window_in_a_pinned_child():
    core, before = min(os.sched_getaffinity(0)), os.sched_getaffinity(0)
    res = measure_host(core, seconds=1.0, window_s=0.25)
    assert res.core == core and res.span_s >= 1.0 and res.window_s == 0.25
    for name in ("matmul", "copy"):
        k = res.kernels[name]
        assert k.calls > 0 and k.run_median_s > 0 and len(k.window_medians_s) >= 3
        assert all(m > 0 for m in k.window_medians_s)
    assert res.busy_cores > 0.3 and res.steal_cores >= 0
    assert os.sched_getaffinity(0) == before   # the child was pinned, not the caller
    assert res.spread >= 1.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(seconds=1.0, window_s=0.0), "positive window"),
    (dict(seconds=1.0, window_s=0.75), "at least two windows"),
    (dict(core=10_000), "not available to this process"),
])
def test_measure_host_names_bad_input(kwargs, message):
    args = dict(core=min(os.sched_getaffinity(0)), seconds=1.0, window_s=0.5) | kwargs
    with pytest.raises(ValueError, match=message):
        measure_host(**args)


def test_between_checks_compares_one_cores_medians_across_checks():
    def at(core, median):
        return HostCheck(core, 10.0, 2.0, 1.0, 0.0, {"matmul": KernelWindows(median, (median, median), 10),
                                                       "copy": KernelWindows(1.0, (1.0, 1.0), 10)})
    assert between_checks([at(0, 1.0), at(1, 2.0)]) == pytest.approx(1.0)        # two cores, one check each
    before_after = [at(0, 16.7), at(1, 12.0), at(0, 19.5), at(1, 12.1)]
    assert between_checks(before_after) == pytest.approx(19.5 / 16.7)
    lines = host_lines(before_after)
    assert "between its checks up to 1.17×" in lines[0]
    assert "the host was steady" in lines[1]                                     # 1.17× is inside the band's 1.22×
    assert "a core's speed moved 1.30× between checks" in host_lines([at(0, 10.0), at(0, 13.0)])[1]
