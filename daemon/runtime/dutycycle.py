"""The bounded duty cycle at which both daemons serve control requests (status, checkpoint, pivot).

Control traffic must never cost training more than a few percent: 100 clients polling `status` once
cut the trainer's throughput to a thirtieth, because the thread answering them held the interpreter
lock the training loop needs between its kernels. So control work runs in bursts: a burst handles
the requests that are queued, until it has used BURST_CPU of its thread's CPU time, and is followed
by a pause of (1/MAX_DUTY − 1) times what it used. ZeroMQ's own I/O thread, which needs no
interpreter lock, queues what arrives meanwhile. Requests are only answered more slowly under a
flood; none is dropped by this.

Why bursts rather than one request per pause: a request handled right after a pause runs on cold
caches and costs 0.3–0.7 ms of CPU here, while one handled right after another costs about 40 µs.
One request per pause answered 55–81 requests a second within the 2%, and among 100 pollers an
operator's `andreactl status` waited 0.9 s for its turn (1.6 s at worst). The burst is capped so that its pause
never exceeds MAX_PAUSE: a longer one would delay the next burst (and an operator's request) for
no gain, and a shorter cap would let the duty exceed MAX_DUTY.
"""

from __future__ import annotations

import time

#: The most of the wall time a daemon's control work may take under a flood of requests.
MAX_DUTY = 0.02
#: The longest pause after a burst (a slow request never delays the next burst longer).
MAX_PAUSE = 0.05
#: The CPU time one burst may use: the most whose pause fits in MAX_PAUSE at MAX_DUTY.
BURST_CPU = MAX_PAUSE * MAX_DUTY / (1 - MAX_DUTY)


class Burst:
    """One burst of control work, timed in its own thread's CPU time (time spent waiting for the
    interpreter lock, which a loaded machine inflates, does not count)."""

    def __init__(self) -> None:
        self._t0 = time.thread_time()

    def used(self) -> float:
        return time.thread_time() - self._t0

    def spent(self) -> bool:
        """True once the burst has used its CPU budget: stop and pause."""
        return self.used() >= BURST_CPU

    def pause(self) -> float:
        """Seconds to pause after this burst to stay within MAX_DUTY."""
        return min(MAX_PAUSE, self.used() * (1 / MAX_DUTY - 1))
