"""Timing and fitting helpers for the measurements of Chapter 3."""
import time

import numpy as np


def best_times(calls, rounds=5):
    """Smallest wall-clock time, in seconds, of each zero-argument function in
    `calls`. The calls take turns, `rounds` times over, so that a slow spell on
    a busy machine hits all of them alike instead of one; disturbances only ever
    add time, so the fastest round of each is the most repeatable estimate.
    Each timed call follows an untimed run of the same call: the caches and the
    allocator are then as this call leaves them, not as the call before it (a
    large one) did, which would otherwise slow it in every round alike."""
    best = np.full(len(calls), np.inf)
    for _ in range(rounds):
        for i, call in enumerate(calls):
            call()
            start = time.perf_counter()
            call()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def loglog_slope(x, y):
    """Slope and intercept of the least-squares line through (log x, log y)."""
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    return slope, intercept

