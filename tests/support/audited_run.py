"""A real run with every event the audit tools mark: restarts, a pivot, a zombie arm, an audit checkpoint.

Built with the real daemons (andrea-proxy and andrea-trainer processes, a real SIGUSR1):

1. proxy + trainer train steps 1..A (phase 0, arms docstrings, code, comments); both stop;
2. the operator writes a new policy and restarts the proxy with a config that no longer lists the
   ``comments`` arm: the proxy pivots at A (the manual pivot) and reports ``comments`` as a zombie;
   the trainer restarts (segment 2), gets a SIGUSR1 (an audit checkpoint) and trains up to B;
3. the trainer restarts once more (segment 3) and trains up to C, the proxy still running.

The run's config turns on the live metrics: TensorBoard event files and Prometheus textfiles
(``RUN/prometheus/``).

Used by the tests of the plot, the metrics exports and the export bundle (one session fixture), and
to draw docs/audit-plot.png::

    .venv/bin/python -m tests.support.audited_run --steps 600 /tmp/audited && \\
        .venv/bin/andreactl plot --run-dir /tmp/audited/run --out docs/audit-plot.png --dpi 80
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tomllib
from pathlib import Path

import tomli_w

from tests.support.daemons import Daemon, trainer_cmd

POLICY = "[arms.code]\nfloor = 0.2\ncap = 0.6\n\n[arms.docstrings]\nfloor = 0.3\n"
ZOMBIE = "comments"


def _proxy(run_dir: Path, *extra: str) -> Daemon:
    return Daemon(
        [sys.executable, "-m", "andrea.daemon.mixing.cli", "--run-dir", str(run_dir), *extra]
    )


METRICS = '[metrics]\ntensorboard = true\nprometheus_textfile_dir = "prometheus"\n'


def _trainer(run_dir: Path, cache: Path, steps: int, every: int, *extra: str) -> Daemon:
    return Daemon(
        trainer_cmd(
            run_dir,
            cache,
            "--mixing",
            "proxy",
            "--max-steps",
            str(steps),
            "--checkpoint-every",
            str(every),
            "--log-every",
            str(max(1, every // 5)),
            *extra,
        )
    )


def _stop(p: Daemon) -> None:
    p.signal(signal.SIGTERM)
    code = p.wait()
    assert code == 0, p.log


def make_audited_run(root: Path, cache: Path, steps: int = 45) -> Path:
    """Build the run in ``root/run`` (``root`` also holds the proxy's reduced config); returns the
    run directory. Phase 0 ends at 2/5 of ``steps``, the second trainer life at 3/4."""
    run_dir = root / "run"
    every = max(5, steps // 9)
    a, b = 2 * steps // 5 // every * every, 3 * steps // 4
    root.mkdir(parents=True, exist_ok=True)
    (root / "metrics.toml").write_text(METRICS)
    proxy = _proxy(run_dir)
    t = _trainer(run_dir, cache, a, every, "--config", str(root / "metrics.toml"))
    assert t.wait() == 0, t.log
    _stop(proxy)

    config = tomllib.loads((run_dir / "run.toml").read_text())
    config["data"]["arms"] = [arm for arm in config["data"]["arms"] if arm["name"] != ZOMBIE]
    reduced = root / "proxy-without-comments.toml"
    reduced.write_text(tomli_w.dumps(config))
    (run_dir / "policy.toml").write_text(POLICY)
    proxy = _proxy(run_dir, "--config", str(reduced))
    proxy.wait_for(rf"pivot: phase 1 starts after step {a}\b")
    t = _trainer(run_dir, cache, b, every)
    t.wait_for(r"step \d+/\d+ \| loss")
    t.signal(signal.SIGUSR1)
    assert t.wait() == 0, t.log
    assert "(sigusr1" in t.log, t.log
    t = _trainer(run_dir, cache, steps, every)
    assert t.wait() == 0, t.log
    _stop(proxy)
    return run_dir


def canonical_rows(run_dir: Path) -> list[dict]:
    """The canonical curve from the raw JSON (not the code under test): newest segment per step."""
    raw = json.loads((run_dir / ".loss.json").read_text())
    newest: dict[int, dict] = {}
    for e in raw:
        if e["step"] not in newest or e["segment"] >= newest[e["step"]]["segment"]:
            newest[e["step"]] = e
    return [newest[s] for s in sorted(newest)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="new directory; the run is ROOT/run")
    parser.add_argument("--steps", type=int, default=45)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "andrea")
    args = parser.parse_args()
    print(make_audited_run(args.root, args.cache_dir, args.steps))


if __name__ == "__main__":
    main()
