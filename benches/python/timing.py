"""Timing shared by the side-by-side benchmarks."""

from __future__ import annotations

import math
import statistics
import time


def medians_ms(fns, reps: int, rounds: int = 5) -> list[float]:
    """Median milliseconds of about `reps` timed runs of each function in `fns`.

    The runs are taken in `rounds` rounds that visit every function in turn (each
    visit starts with one untimed warm-up run), so a burst of noise on a shared
    machine lands on every row alike instead of on one row's whole sample. A run's
    result is dropped before the next run starts, outside the timed region.
    """
    per_visit = max(1, math.ceil(reps / rounds))
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, samples):
            fn()
            for _ in range(per_visit):
                t0 = time.perf_counter()
                out = fn()
                times.append(time.perf_counter() - t0)
                del out
    return [statistics.median(times) * 1e3 for times in samples]
