"""How fast this machine is at what the suite waits on, in one line atop every test run, so that a
slow run says whether the machine or the change was slow: a Python loop, writing memory (pages
written before, and fresh ones), and how late a short timed wait wakes. docs/benchmarks.md has
a slow shared VM's figures (a normal machine's are still to be taken). `python -m
tests.machine_speed` prints the line alone; `--steadiness` also times the same small piece of
work many times over, whose spread says whether a stream's worst gap can be measured there.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

BUFFER_BYTES = 64 << 20
WAIT_S = 0.01
WAITS = 10
STEADY_SIZE = 400  # a float32 matmul of this side, about a millisecond of one core
STEADY_REPEATS = 20  # matmuls a sample
STEADY_SAMPLES = 200


def python_loop_s() -> float:
    """Seconds for a plain loop of ten million additions."""
    start = time.perf_counter()
    sum(range(10_000_000))
    return time.perf_counter() - start


def memory_write_gb_s() -> tuple[float, float]:
    """GB/s writing a buffer's pages for the first time (the OS maps each), then again."""
    start = time.perf_counter()
    buffer = np.ones(BUFFER_BYTES // 8)
    fresh = time.perf_counter() - start
    start = time.perf_counter()
    buffer[:] = 2.0
    again = time.perf_counter() - start
    return BUFFER_BYTES / fresh / 1e9, BUFFER_BYTES / again / 1e9


def wait_overshoot_ms() -> float:
    """The median of how much later than asked a 10 ms sleep wakes."""
    late = []
    for _ in range(WAITS):
        start = time.perf_counter()
        time.sleep(WAIT_S)
        late.append(time.perf_counter() - start - WAIT_S)
    return statistics.median(late) * 1e3


def describe() -> str:
    fresh, again = memory_write_gb_s()
    return (
        f"machine: a 10M-step Python loop {python_loop_s():.2f} s; memory writes "
        f"{again:.1f} GB/s, {fresh:.2f} GB/s to fresh pages; a 10 ms sleep wakes "
        f"{wait_overshoot_ms():.1f} ms late"
    )


def steadiness_ms() -> tuple[float, float, float]:
    """The median, 90th percentile and worst of a fixed piece of work timed STEADY_SAMPLES
    times (matmuls into a buffer written before: no allocation, no page faults). On a steady
    machine the three are close; where the OS or the host takes the core away, they are not."""
    rng = np.random.default_rng(0)
    a = rng.random((STEADY_SIZE, STEADY_SIZE), dtype=np.float32)
    out = np.empty_like(a)
    samples = []
    for _ in range(STEADY_SAMPLES):
        start = time.perf_counter()
        for _ in range(STEADY_REPEATS):
            np.matmul(a, a, out=out)
        samples.append((time.perf_counter() - start) * 1e3)
    samples.sort()
    return statistics.median(samples), samples[int(0.9 * len(samples))], samples[-1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steadiness", action="store_true", help="time a fixed piece of work")
    print(describe())
    if parser.parse_args().steadiness:
        median, p90, worst = steadiness_ms()
        print(
            f"steadiness: {STEADY_REPEATS} {STEADY_SIZE}x{STEADY_SIZE} matmuls, "
            f"{STEADY_SAMPLES} times: median {median:.1f} ms, 90th percentile {p90:.1f} ms, "
            f"worst {worst:.1f} ms"
        )
