"""The GIL is released while a kernel runs: another Python thread makes progress during the call.
_attnops.calls_in_flight() is raised (GIL held) before the GIL is released and lowered after it
is taken back, so another thread can only ever see it above 0 if the GIL was released."""

import threading

import numpy as np

import attnops
from attnops import _attnops


def watch_while(run_calls):
    """Runs run_calls(stop_event) on this thread while another thread counts the iterations of a
    Python loop it made while an attnops call was in flight; returns that count."""
    progressed = [0]
    stop = threading.Event()

    def watcher():
        while not stop.is_set():
            if _attnops.calls_in_flight() > 0:
                progressed[0] += 1  # Python bytecode ran during a call
                if progressed[0] >= 100:
                    stop.set()

    t = threading.Thread(target=watcher)
    t.start()
    try:
        run_calls(stop)
    finally:
        stop.set()
        t.join()
    return progressed[0]


def test_gil_released_during_forward_and_backward():
    rng = np.random.default_rng(0)
    q = rng.uniform(-1, 1, (1, 256, 4, 64)).astype(np.float32)
    op = attnops.registry().get("vanilla", config={"backend": "native"})  # the fp64 oracle: slow

    def forwards(stop):
        for _ in range(50):
            op(q, q, q)
            if stop.is_set():
                return

    assert watch_while(forwards) >= 100
    r = op(q, q, q, return_lse=True)

    def backwards(stop):
        for _ in range(50):
            op.backward(q, q, q, r.out, r.lse, r.out)
            if stop.is_set():
                return

    assert watch_while(backwards) >= 100
    assert _attnops.calls_in_flight() == 0


def test_concurrent_calls_from_threads_agree():
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(-1, 1, (1, 64, 2, 32)).astype(np.float32) for _ in range(4)]
    op = attnops.registry().get("flash_attn2", config={"backend": "cpu"})
    expected = [op(x, x, x, causal=False).out for x in inputs]
    results = [None] * 4

    def work(i):
        for _ in range(5):
            results[i] = op(inputs[i], inputs[i], inputs[i], causal=False).out

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)  # bitwise: the kernels are deterministic
