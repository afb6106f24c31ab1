"""The progress line's structured journal fields (STEP=, LOSS=, LR=, ARM=, PHASE=), as journald gets them.

The trainer runs as under systemd (INVOCATION_ID set, so it logs through systemd-python's
JournalHandler and libsystemd's sd_journal_sendv), inside a private user + mount namespace whose
/run is a fresh tmpfs: there the test itself binds /run/systemd/journal/socket and reads the
datagrams journald would read, in journald's native protocol. Nothing outside the namespace is
touched; no systemd runs. (The full path through a real journald and `journalctl STEP=` belongs to
the real-systemd harness.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemons import trainer_cmd

# Run as root of a new user namespace: mount a tmpfs on /run, listen where journald listens, start
# the trainer, and print every datagram's fields as JSON.
NAMESPACE_SCRIPT = r"""
import json, os, socket, struct, subprocess, sys, time
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run"], check=True)
os.makedirs("/run/systemd/journal")
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind("/run/systemd/journal/socket")
sock.settimeout(0.2)
env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_STREAM", "NOTIFY_SOCKET")}
env["INVOCATION_ID"] = "0" * 32
trainer = subprocess.Popen(json.loads(sys.argv[1]), env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)


def fields(data):
    out, i = {}, 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            key, value = line.split(b"=", 1)
            i = nl + 1
        else:  # binary-safe form: KEY\n, little-endian u64 length, value, \n
            key, size = line, struct.unpack("<Q", data[nl + 1 : nl + 9])[0]
            value = data[nl + 9 : nl + 9 + size]
            i = nl + 9 + size + 1
        out[key.decode()] = value.decode(errors="replace")
    return out


records, deadline = [], time.monotonic() + 300
while time.monotonic() < deadline:
    try:
        records.append(fields(sock.recv(1 << 20)))
    except socket.timeout:
        if trainer.poll() is not None:
            break
print(json.dumps({"code": trainer.wait(), "stderr": trainer.stderr.read().decode(), "records": records}))
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) for a private /run")
def test_progress_lines_carry_journal_fields(tmp_path: Path, cache_dir: Path) -> None:
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces unavailable: {probe.stderr.decode().strip()}")
    cmd = trainer_cmd(tmp_path / "run", cache_dir, "--max-steps", "6", "--log-every", "2")
    res = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", NAMESPACE_SCRIPT, json.dumps(cmd)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["code"] == 0, out["stderr"]
    assert out["stderr"] == "", "under systemd every line goes to the journal"
    progress = [r for r in out["records"] if "STEP" in r]
    assert [r["STEP"] for r in progress] == ["2", "4", "6"]
    entries = {e["step"]: e for e in json.loads((tmp_path / "run" / ".loss.json").read_text())}
    for r in progress:
        e = entries[int(r["STEP"])]
        assert r["MESSAGE"].startswith(f"step {e['step']}/6 | loss ")
        assert float(r["LOSS"]) == pytest.approx(e["loss"], rel=1e-5)
        assert float(r["LR"]) == pytest.approx(e["lr"], rel=1e-5)
        assert (r["ARM"], int(r["PHASE"])) == (e["arm"], e["phase"])
        assert r["SYSLOG_IDENTIFIER"] == "andrea-trainer" and r["PRIORITY"] == "6"
    summary = [r for r in out["records"] if r["MESSAGE"].startswith("run summary:")]
    assert len(summary) == 1 and "steps 1-6 (6 trained)" in summary[0]["MESSAGE"]
