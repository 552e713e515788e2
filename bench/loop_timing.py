"""How bench/peers.py's child processes time one form of the counter loop (c < N: c + 1, x + 1),
whatever the peer: only the standard library and harness, so that JAX's environment, which has
neither torch nor lazyrt, can run it too."""

import time

from harness import time_side_by_side

# A warm call longer than this: 2 single calls are timed, no batches.
LONG_CALL_S = 1.0


# Warm-up calls after the first, not kept: at least one, and calls until this long has passed.
WARMUP_S = 0.3


def measure_loop(call, n, reps, settle=None):
    """call() runs the loop to N = n, waits for it and returns (c, x) as Python numbers. The first
    call of this process (compile included) is timed alone; unless it returned c = x = n (the
    parent reports the mismatch, nothing is timed), warm-up calls follow for WARMUP_S (at least
    one), not kept, then settle() if given (a peer that compiles in the background waits for it
    there, so that the warm calls time its steady state), then `reps` batches of warm calls of
    about 20 ms each (time_side_by_side), or 2 single calls where one takes over LONG_CALL_S.
    Every timed call's result is checked too. Returns {"first": seconds, "c", "x", "warm":
    [seconds per call, one per batch]} ("warm" only where right)."""
    t0 = time.perf_counter()
    c, x = call()
    out = {"first": time.perf_counter() - t0, "c": c, "x": x}
    if not (c == n and x == float(n)):
        return out
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        call()
        once = time.perf_counter() - t0
        if t0 + once - start >= WARMUP_S:
            break
    if settle is not None:
        settle()
        t0 = time.perf_counter()
        call()
        once = time.perf_counter() - t0
    wrong = []

    def checked():
        got = call()
        if got != (n, float(n)):
            wrong.append(got)
    if once > LONG_CALL_S:
        samples = time_side_by_side({"f": checked}, 1, 2, warmup=0)["f"]
    else:
        samples = time_side_by_side({"f": checked}, max(1, int(0.02 / max(once, 1e-9))), reps, warmup=0)["f"]
    if wrong:
        out["c"], out["x"] = wrong[0]
        return out
    out["warm"] = samples.in_order
    return out
