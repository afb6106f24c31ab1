"""Training throughput under a flood of `status` requests: the ratio with 100 pollers to none.

    .venv/bin/python tests/bench/bench_status_load.py [--pollers 100] [--rounds 2] [--seconds 20]
                                                      [--with-proxy]

Each round starts a real andrea-tiny trainer in a fresh run directory twice, once alone and once
with POLLERS clients (DEALER sockets spread over 4 processes, each sending `status` again as soon
as the previous reply arrived: a closed loop, as fast as the trainer answers), alternating which
goes first. Throughput is the median tok/s of the trainer's own progress lines over SECONDS after
warm-up. The figure is the ratio loaded ÷ alone (goal ≥ 0.9), per round and as the median of the
rounds; the pollers' achieved request rate is reported too. With --with-proxy the trainer runs
with its proxy (proxy mixing) and the pollers are split between the two daemons' sockets.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CLIENT_PROCESSES = 4


def _poll_worker(ep: str, n_sockets: int, stop: mp.Event, counter: mp.Value) -> None:
    import zmq

    from andrea.protocol import messages as m

    ctx = zmq.Context.instance()

    def loop() -> None:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(ep)
        n = 0
        while not stop.is_set():
            sock.send_multipart([b"", m.encode(m.StatusRequest(id=f"{n}"))])
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


def one_run(
    cache: str, pollers: int, seconds: float, threads: int, with_proxy: bool
) -> tuple[float, float]:
    """(median tok/s, status replies per second) of one trainer life."""
    from andrea.daemon.rundir import endpoint

    with tempfile.TemporaryDirectory(prefix="andrea-bench-status-") as d:
        cmd = [
            sys.executable,
            "-m",
            "andrea.daemon.trainer_cli",
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
            "20",
            "--threads",
            str(threads),
            "--cache-dir",
            cache,
            *(["--with-proxy"] if with_proxy else []),
        ]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        stop, counter, workers = mp.Event(), mp.Value("l", 0), []
        tok_s: list[float] = []
        started = measuring = None
        rate = 0.0
        try:
            for line in proc.stderr:
                m = re.search(r"step (\d+)/\d+ .*\| (\d+) tok/s", line)
                if not m:
                    continue
                now = time.monotonic()
                if started is None:
                    started = now
                    eps = [endpoint(Path(d), "trainer")]
                    if with_proxy:
                        eps.append(endpoint(Path(d), "proxy"))
                    per = [pollers // CLIENT_PROCESSES] * CLIENT_PROCESSES
                    per[0] += pollers - sum(per)
                    workers = [
                        mp.Process(target=_poll_worker, args=(eps[i % len(eps)], n, stop, counter))
                        for i, n in enumerate(per)
                        if n
                    ]
                    for w in workers:
                        w.start()
                    continue
                if measuring is None:
                    if now - started < 3.0:  # warm-up, and the pollers connecting
                        continue
                    measuring, replies0 = now, counter.value
                tok_s.append(float(m.group(2)))
                if now - measuring >= seconds:
                    rate = (counter.value - replies0) / (now - measuring)
                    break
            else:
                raise RuntimeError(
                    f"the trainer exited (code {proc.wait()}) before the measurement"
                )
        finally:
            stop.set()
            for w in workers:
                w.join(timeout=10)
            proc.terminate()
            proc.wait(timeout=60)
        return statistics.median(tok_s), rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pollers", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "andrea"))
    ap.add_argument("--with-proxy", action="store_true")
    args = ap.parse_args()
    ratios = []
    for r in range(args.rounds):
        order = [0, args.pollers] if r % 2 == 0 else [args.pollers, 0]
        got = {}
        for n in order:
            got[n] = one_run(args.cache_dir, n, args.seconds, args.threads, args.with_proxy)
            print(
                f"round {r + 1}: {n:3d} pollers: {got[n][0]:,.0f} tok/s, "
                f"{got[n][1]:,.0f} status replies/s",
                flush=True,
            )
        ratios.append(got[args.pollers][0] / got[0][0])
        print(f"round {r + 1}: ratio {ratios[-1]:.3f}", flush=True)
    print(
        f"throughput with {args.pollers} pollers ÷ alone: median {statistics.median(ratios):.3f}"
        f" over {args.rounds} rounds ({', '.join(f'{x:.3f}' for x in ratios)})"
    )


if __name__ == "__main__":
    main()
