"""Training throughput under a flood of `status` requests: the ratio with 100 pollers to none.

    .venv/bin/python tests/bench/bench_status_load.py [--pollers 100] [--windows 12] [--seconds 8]
                                                      [--with-proxy]

One real andrea-tiny trainer runs for the whole measurement. POLLERS clients (DEALER sockets spread
over 4 processes, each sending `status` again as soon as the previous reply arrived: a closed
loop, as fast as the daemon answers) are switched on and off in alternating windows of SECONDS,
in the order off, on, on, off, ... so that a drift of the machine's load falls on both sides
alike. Each poller process is a session of its own (as an operator's andreactl is), and so is the
trainer. Throughput is the trainer's own tok/s progress lines; the figure is the median over the
"on" windows ÷ the median over the "off" windows (goal ≥ 0.9), with the replies per second the
pollers got, and how long an operator's own `status` to the trainer (a fresh socket, once a second
during the "on" windows) waited for its answer. With --with-proxy the trainer runs with its proxy
and the pollers are split between the two daemons' sockets.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CLIENT_PROCESSES = 4


def _poll_worker(ep: str, n_sockets: int, active: mp.Event, stop: mp.Event, counter) -> None:
    # Clients run in sessions of their own, as andreactl in an operator's shell does: with the
    # kernel's autogroup scheduling, CPU is shared between sessions, and pollers inside the
    # trainer's session would change its share rather than measure the daemon.
    os.setsid()
    import zmq

    from andrea.protocol import messages

    ctx = zmq.Context.instance()

    def loop() -> None:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(ep)
        n = 0
        while not stop.is_set():
            if not active.wait(0.1):
                continue
            sock.send_multipart([b"", messages.encode(messages.StatusRequest(id=f"{n}"))])
            n += 1
            if sock.poll(5000):
                sock.recv_multipart()
                with counter.get_lock():
                    counter.value += 1
            else:  # Lazy Pirate, as andreactl does
                sock.close(linger=0)
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(ep)
        sock.close(linger=0)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(n_sockets)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=6)


def main() -> None:
    from andrea.daemon.rundir.layout import endpoint
    from andrea.protocol.messages import StatusRequest
    from andrea.protocol.transport import new_id, request

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pollers", type=int, default=100)
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "andrea"))
    ap.add_argument("--with-proxy", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="andrea-bench-status-") as d:
        cmd = [
            sys.executable,
            "-m",
            "andrea.daemon.trainer.service.cli",
            "--run-dir",
            d,
            "--preset",
            "andrea-tiny",
            "--max-steps",
            "10000000",
            "--checkpoint-every",
            "0",
            "--sample-every",
            "0",
            "--log-every",
            "5",
            "--threads",
            str(args.threads),
            "--cache-dir",
            args.cache_dir,
            *(["--with-proxy"] if args.with_proxy else []),
        ]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
        lines: queue.Queue[float] = queue.Queue()
        tail: list[str] = []

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                tail[:] = [*tail[-19:], line]
                if m := re.search(r"step \d+/\d+ .*\| (\d+) tok/s", line):
                    lines.put(float(m.group(1)))

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 600
        while lines.empty():  # the first progress line: set up and training
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                sys.exit(f"the trainer did not start training:\n{''.join(tail)}")
            time.sleep(0.2)
        eps = [endpoint(Path(d), "trainer")]
        if args.with_proxy:
            eps.append(endpoint(Path(d), "proxy"))
        active, stop, counter = mp.Event(), mp.Event(), mp.Value("l", 0)
        per = [args.pollers // CLIENT_PROCESSES] * CLIENT_PROCESSES
        per[0] += args.pollers - sum(per)
        workers = [
            mp.Process(target=_poll_worker, args=(eps[i % len(eps)], n, active, stop, counter))
            for i, n in enumerate(per)
            if n
        ]
        for w in workers:
            w.start()
        samples: dict[bool, list[float]] = {False: [], True: []}
        rates: list[float] = []
        waits: list[float] = []
        try:
            time.sleep(3.0)  # warm-up, the pollers' imports
            for i in range(args.windows):
                on = i % 4 in (1, 2)
                (active.set if on else active.clear)()
                time.sleep(1.0)  # let the previous window's requests drain
                while not lines.empty():
                    lines.get_nowait()
                replies0, t0 = counter.value, time.monotonic()
                while (left := t0 + args.seconds - time.monotonic()) > 0:
                    time.sleep(min(1.0, left))
                    if on and left > 1.0:  # an operator's request, on a fresh socket
                        t_ask = time.monotonic()
                        request(eps[0], StatusRequest(id=new_id()), timeout=30, retries=1)
                        waits.append(time.monotonic() - t_ask)
                got = []
                while not lines.empty():
                    got.append(lines.get_nowait())
                samples[on] += got
                if on:
                    rates.append((counter.value - replies0) / (time.monotonic() - t0))
                print(
                    f"window {i + 1:2d} {'on ' if on else 'off'}: median {statistics.median(got):,.0f}"
                    f" tok/s over {len(got)} lines"
                    + (f", {rates[-1]:,.0f} replies/s" if on else ""),
                    flush=True,
                )
        finally:
            stop.set()
            active.set()
            for w in workers:
                w.join(timeout=10)
            proc.terminate()
            proc.wait(timeout=60)
    off, on = statistics.median(samples[False]), statistics.median(samples[True])
    print(
        f"{args.pollers} pollers{' (trainer and proxy)' if args.with_proxy else ''}: "
        f"{on:,.0f} tok/s vs {off:,.0f} alone → ratio {on / off:.3f};"
        f" {statistics.median(rates):,.0f} status replies/s; an operator's status answered in"
        f" {statistics.median(waits):.2f} s (median), {max(waits):.2f} s (max of {len(waits)})"
    )


if __name__ == "__main__":
    main()
