"""Fuzz harness: every file the daemons read and every message type, mutated field by field.

Each case starts from a valid instance, changes one thing (a leaf replaced by a hostile value, a
key deleted, an unknown key added, bytes cut or inserted) and runs the daemons' own read path on it.
The oracle, for every kind:
- the outcome is a documented one: the value is accepted, or the documented error is raised
  (the one the daemon turns into its exit code or error reply; see docs/operations.md);
- nothing else escapes: no other exception, so no traceback;
- the read allocates at most ALLOCATION_BOUND bytes (tracemalloc, which numpy reports to);
- a rejected input changes nothing durable (every file's bytes are compared), except the
  documented move-aside of a damaged `.state.json` or `.samples.json`, whose bytes are kept.

    .venv/bin/python -m pytest -q tests/*/test_fuzz.py                  # CI: EXAMPLES per kind
    ANDREA_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest -q tests/*/test_fuzz.py   # the long run

Every run-directory file a command or a daemon reads also gets two kinds of its own: a link to a
valid copy of it outside the run directory, and a FIFO. Nothing may read through the link (except a
config a person may link: run.toml, policy.toml, read by the daemons) or block on the FIFO.

The data arms get links among their files (to a 0600 file outside, through a directory, a relative
`../..` or a chain; inside the arm or the run; dangling; to a FIFO or /dev/zero): one that leaves the
arm's directory and the run's refuses the arm unless it says links = "follow", and the secret is
never read nor cached.

What an arm reads is fuzzed too: JSON Lines lines (lone and raw surrogates, bytes that are not
JSON, lines around the bound), gzip bombs without a newline (16 to 64 MiB of NUL bytes, read under
the allocation bound), and token-cache entries cut, grown, bit-flipped or given ids out of range
(the arm must come out as the tokens its files encode to, the entry as encoding wrote it).

Message cases bind real ipc sockets (an in-process proxy, and the trainer's control server with a
real ZeroMQ client) and are marked `process`, as are the commands' link and FIFO cases (an alarm
signal guards each command against blocking).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w
from hypothesis import assume, given
from hypothesis import strategies as st

from andrea.daemon.checkpoint.manager import CheckpointManager, ResumeRefused
from andrea.daemon.config import CheckpointConfig, ConfigError, DataConfig, build_config
from andrea.daemon.data.arms import load_arms
from andrea.daemon.data.sources import DataError, jsonl_documents
from andrea.daemon.data.tokenizer import ByteTokenizer
from andrea.daemon.mixing.policy import Policy, PolicyError, parse_policy
from andrea.daemon.mixing.proxy import Proxy, ProxyOptions, configured_arms
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.rundir.losslog import LossLog, LossLogCorrupt, read_curve, read_entries
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.protocol.lossentry import LossEntry
from tests.support.fuzzing import (
    FUZZ,
    Blocked,
    atime_is_recorded,
    bounded,
    build_proxy_run,
    build_stopped_run,
    mutate_bytes,
    mutations,
    plant,
    snapshot,
    within_alarm,
)
from tests.support.hostile import expectation, resign, text_arms_config, write_checkpoint

# ---- checkpoint manifests ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fuzz-ckpt")
    for step in (10, 20):
        write_checkpoint(d, step)
    return d


def _manifest_case(ckpt_dir: Path, tmp_path: Path, content: bytes) -> None:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    for p in ckpt_dir.iterdir():
        (run / p.name).write_bytes(p.read_bytes())
    (run / rundir.manifest_name(20)).write_bytes(content)
    before = snapshot(run)
    mgr = CheckpointManager(run, CheckpointConfig(every=0))
    try:
        loaded = bounded(lambda: mgr.load(expectation()))
    except ResumeRefused:  # exit 4: an intact manifest of another model, data or config
        loaded = None
    finally:
        mgr.close()
    if loaded is not None:
        assert loaded.manifest.step in (10, 20)
        if loaded.manifest.step == 10:
            assert "step_000020.json" in loaded.skipped[0]
    assert snapshot(run) == before


@FUZZ
@given(data=st.data())
def test_fuzz_manifest(ckpt_dir: Path, tmp_path: Path, data: st.DataObject) -> None:
    valid = json.loads((ckpt_dir / rundir.manifest_name(20)).read_text())
    _, bad = data.draw(mutations(valid))
    _manifest_case(ckpt_dir, tmp_path, json.dumps(bad).encode())


@FUZZ
@given(data=st.data())
def test_fuzz_manifest_resigned(ckpt_dir: Path, tmp_path: Path, data: st.DataObject) -> None:
    """The hash recomputed, so the value checks behind it are what must hold."""
    valid = json.loads((ckpt_dir / rundir.manifest_name(20)).read_text())
    _, bad = data.draw(mutations(valid))
    try:
        content = json.dumps(resign(bad), allow_nan=False).encode()
    except ValueError:  # NaN cannot be canonical JSON: the plain mutation covers it
        assume(False)
    _manifest_case(ckpt_dir, tmp_path, content)


# ---- .loss.json ----------------------------------------------------------------------------------


def _valid_log(path: Path) -> bytes:
    with LossLog.open(path) as log:
        for step in range(1, 6):
            log.append(
                LossEntry(
                    step=step,
                    loss=1.0 / step,
                    arm="alpha",
                    lr=1e-3,
                    tokens=64,
                    wall_time=1.0,
                    segment=1,
                    phase=0,
                    batch_sha256=None,
                )
            )
    return path.read_bytes()


def _read_log_everywhere(path: Path) -> None:
    """Every reader either reads it or raises LossLogCorrupt (proxy exit 4, andreactl error); a
    writer that refuses leaves the file as it was."""
    for reader in (read_entries, read_curve):
        try:
            bounded(lambda reader=reader: reader(path))
        except LossLogCorrupt:
            pass
    before = path.read_bytes()
    try:
        bounded(lambda: LossLog.open(path).close())
    except LossLogCorrupt:
        assert path.read_bytes() == before


@FUZZ
@given(data=st.data())
def test_fuzz_loss_log_fields(tmp_path: Path, data: st.DataObject) -> None:
    path = tmp_path / rundir.LOSS_FILE
    path.unlink(missing_ok=True)
    lines = _valid_log(path).split(b"\n")
    i = data.draw(st.integers(1, 5))  # lines[1..5] are the entries
    entry = json.loads(lines[i].rstrip(b","))
    _, bad = data.draw(mutations(entry))
    comma = b"," if lines[i].endswith(b",") else b""
    lines[i] = json.dumps(bad, separators=(",", ":")).encode() + comma
    path.write_bytes(b"\n".join(lines))
    _read_log_everywhere(path)


@FUZZ
@given(data=st.data())
def test_fuzz_loss_log_bytes(tmp_path: Path, data: st.DataObject) -> None:
    path = tmp_path / rundir.LOSS_FILE
    path.unlink(missing_ok=True)

    def nul_tail(buf: bytearray, at: int) -> None:
        buf += b"\0" * data.draw(st.sampled_from([1, 4096, (1 << 20) + 1]))

    path.write_bytes(mutate_bytes(_valid_log(path), data, nul_tail))
    _read_log_everywhere(path)


# ---- the proxy's own files: .state.json and .samples.json ---------------------------------------


@pytest.fixture(scope="module")
def proxy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A proxy run directory with a valid .state.json and .samples.json."""
    return build_proxy_run(tmp_path_factory.mktemp("fuzz-proxy"))


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory, proxy_run: Path) -> Path:
    """A stopped run with one of every file a command reads (tests/support/fuzzing.py)."""
    return build_stopped_run(tmp_path_factory.mktemp("fuzz-links") / "run", proxy_run)


@pytest.fixture(scope="module")
def atime_is_kept(tmp_path_factory: pytest.TempPathFactory) -> bool:
    """Whether this filesystem records a read in the access time; the link oracle relies on it."""
    return atime_is_recorded(tmp_path_factory.mktemp("atime"))


def _proxy_file_case(proxy_run: Path, tmp_path: Path, name: str, content: bytes) -> None:
    run = tmp_path / "run"
    if run.exists():
        for p in run.iterdir():
            if p.is_file():
                p.unlink()
    else:
        run.mkdir()
    for p in proxy_run.iterdir():
        if p.is_file():
            (run / p.name).write_bytes(p.read_bytes())
    (run / name).write_bytes(content)
    proxy = Proxy(ProxyOptions(run, text_arms_config(proxy_run), Policy(lag=2)), OperatorRequests())
    proxy.configured = configured_arms(proxy.opts.cfg, proxy_run)  # the arms live there
    logged = read_entries(run / rundir.LOSS_FILE)
    if name == rundir.STATE_FILE:
        bounded(lambda: proxy._restore_bandit(logged))
    else:
        bounded(proxy._load_samples)
    moved = list(run.glob(f"{name}.corrupt-*"))
    if moved:  # the documented outcome for a damaged file: moved aside, bytes kept
        assert moved[0].read_bytes() == content and not (run / name).exists()
    else:
        assert (run / name).read_bytes() == content


@FUZZ
@given(data=st.data())
def test_fuzz_state_file(proxy_run: Path, tmp_path: Path, data: st.DataObject) -> None:
    valid = json.loads((proxy_run / rundir.STATE_FILE).read_text())
    _, bad = data.draw(mutations(valid))
    _proxy_file_case(proxy_run, tmp_path, rundir.STATE_FILE, json.dumps(bad).encode())


@FUZZ
@given(data=st.data())
def test_fuzz_samples_file(proxy_run: Path, tmp_path: Path, data: st.DataObject) -> None:
    valid = json.loads((proxy_run / rundir.SAMPLES_FILE).read_text())
    _, bad = data.draw(mutations(valid))
    _proxy_file_case(proxy_run, tmp_path, rundir.SAMPLES_FILE, json.dumps(bad).encode())


# ---- run.toml and policy.toml --------------------------------------------------------------------


def _toml_or_skip(value: dict) -> str:
    try:
        text = tomli_w.dumps(value)
        tomllib.loads(text)
        return text
    except (TypeError, ValueError):  # None, or a value TOML cannot hold: not a file anyone writes
        assume(False)
        raise AssertionError from None


@FUZZ
@given(data=st.data())
def test_fuzz_run_toml(tmp_path: Path, data: st.DataObject) -> None:
    valid = build_config({}, {"preset": "andrea-tiny"}).model_dump(mode="json", exclude_none=True)
    _, bad = data.draw(mutations(valid))
    (tmp_path / "run.toml").write_text(_toml_or_skip(bad))
    from andrea.daemon.config import load_toml

    try:
        bounded(lambda: build_config(load_toml(tmp_path / "run.toml")))
    except ConfigError:  # exit 2
        pass


@FUZZ
@given(data=st.data())
def test_fuzz_policy_toml(data: st.DataObject) -> None:
    valid = {
        "alpha": 0.9,
        "lag": 8,
        "arms": {"alpha": {"floor": 0.1, "cap": 0.8}, "beta": {"floor": 0.0, "cap": 1.0}},
        "initial_weights": {"alpha": 2.0},
    }
    parse_policy(tomli_w.dumps(valid))  # the starting point is valid
    _, bad = data.draw(mutations(valid))
    text = _toml_or_skip(bad)
    try:
        bounded(lambda: parse_policy(text))
    except PolicyError:  # exit 2, or an error reply to `pivot`
        pass


# ---- links and FIFOs: every run-directory file any command reads -------------------------------
#
# Two more kinds for each file: a link to a valid copy of it outside the run directory (so that a
# reader that followed it would succeed, and show it), and a FIFO (so that a reader that opened it
# as a file would block forever). The oracle: every command returns a documented exit code without
# a traceback, within ALARM_S; the run directory is left exactly as it was; and the link's target
# is never read (its access time stays where the test set it: the epoch).


#: What the daemons read at start, and the outcome each documents for a link or a FIFO there.
def _daemon_reads(run: Path, name: str) -> None:
    if name == rundir.CONFIG_FILE:
        from andrea.daemon.config import load_toml

        load_toml(run / name)  # a person's config may be a link: followed, regular, bounded
    elif name == rundir.POLICY_FILE:
        from andrea.daemon.mixing.policy import load_policy

        load_policy(run / name)
    else:
        mgr = CheckpointManager(run, CheckpointConfig(every=0))
        try:
            loaded = mgr.load(expectation())
        finally:
            mgr.close()
        assert loaded is not None and loaded.manifest.step == 10, "the newest is skipped"
        assert "not a regular file" in loaded.skipped[0], loaded.skipped


@pytest.mark.parametrize("kind", ["link", "fifo"])
@pytest.mark.parametrize(
    "name", [rundir.CONFIG_FILE, rundir.POLICY_FILE, rundir.manifest_name(20), rundir.bin_name(20)]
)
def test_daemon_reads_of_links_and_fifos(
    stopped_run: Path, tmp_path: Path, name: str, kind: str, atime_is_kept: bool
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for p in stopped_run.iterdir():
        if p.is_file():
            shutil.copy2(p, run / p.name)
    outside = tmp_path / "outside"
    outside.mkdir()
    targets = plant(run, name, kind, outside)
    followed = kind == "link" and name in (rundir.CONFIG_FILE, rundir.POLICY_FILE)
    try:
        within_alarm(_daemon_reads, run, name)
    except Blocked:
        pytest.fail(f"reading {name} ({kind}) blocked")
    except (ConfigError, PolicyError) as e:
        assert kind == "fifo" and "not a regular file (a FIFO)" in str(e), e
    if atime_is_kept and not followed:
        assert all(t.stat().st_atime == 0 for t in targets), f"{name} read through its link"


# ---- links among an arm's files -----------------------------------------------------------------
#
# A run's text and JSON Lines arms with links planted among their files: to a 0600 file outside
# (directly, through a directory link, a relative `../..`, or a chain of links), inside the arm or
# the run (directly, or through a hop outside that comes back), dangling, to a FIFO or /dev/zero.
# The oracle: a link whose target lies outside the arm's directory and the run's refuses the arm
# (SourceRejected) unless the arm says links = "follow", and then nothing of the secret is read (its
# access time stays at the epoch) nor reaches the cache; any other planting is read or passed over;
# nothing blocks, and nothing else escapes.

SECRET_TEXT = "SECRET-6f1c-"
#: Each planting: (where the link goes, whether it leaves the arm's directory and the run's).
LINK_KINDS = {
    "secret": True,
    "secret-dir": True,
    "relative-escape": True,
    "chain-out": True,
    "inside-arm": False,
    "inside-run": False,
    "chain-back-in": False,
    "dangling": False,
    "fifo": False,
    "dev-zero": False,
}


def _links_run(base: Path) -> tuple[Path, Path]:
    """A run with a text arm (notes/**/*.md) and a JSON Lines arm (web/*.jsonl), and beside it a
    folder `outside` holding 0600 secrets of both kinds, a directory of them and a FIFO."""
    run, outside = base / "run", base / "outside"
    for d in (run / "notes" / "sub", run / "web", run / "shared", outside / "dir"):
        d.mkdir(parents=True)
    for i in range(2):
        (run / "notes" / f"n{i}.md").write_text(f"note {i} " * 50)
    (run / "web" / "a.jsonl").write_text(json.dumps({"text": "web page " * 40}) + "\n")
    (run / "shared" / "b.md").write_text("shared note " * 30)
    (run / "shared" / "b.jsonl").write_text(json.dumps({"text": "shared page"}) + "\n")
    for where in (outside, outside / "dir"):
        (where / "secret.md").write_text(SECRET_TEXT * 100)
        (where / "secret.jsonl").write_text(json.dumps({"text": SECRET_TEXT * 100}) + "\n")
    os.mkfifo(outside / "fifo")
    for p in outside.rglob("secret.*"):
        p.chmod(0o600)
        os.utime(p, (0, p.stat().st_mtime))
    return run, outside


def _plant_link(run: Path, outside: Path, arm: str, kind: str, i: int) -> None:
    """One link of `kind` among the files of arm `arm` (notes or web), named to match its glob."""
    ext = "md" if arm == "notes" else "jsonl"
    where = run / arm / ("sub" if arm == "notes" and i % 2 else "")
    link = where / f"zz{i}.{ext}"
    if kind == "secret-dir":  # only a recursive glob descends into it
        (run / "notes" / f"d{i}").symlink_to(outside / "dir", target_is_directory=True)
        return
    hop = outside / f"hop{i}.{ext}"
    target = {
        "secret": outside / f"secret.{ext}",
        "relative-escape": Path(os.path.relpath(outside / f"secret.{ext}", where)),
        "chain-out": run / "shared" / f"hop{i}.{ext}",
        "inside-arm": run / arm / ("n0.md" if ext == "md" else "a.jsonl"),
        "inside-run": run / "shared" / f"b.{ext}",
        "chain-back-in": hop,
        "dangling": outside / "missing",
        "fifo": outside / "fifo",
        "dev-zero": Path("/dev/zero"),
    }[kind]
    if kind == "chain-out":
        (run / "shared" / f"hop{i}.{ext}").symlink_to(outside / f"secret.{ext}")
    elif kind == "chain-back-in":
        hop.symlink_to(run / "shared" / f"b.{ext}")
    link.symlink_to(target)


def _links_config(run: Path, follow: bool) -> Any:
    links = {"links": "follow"} if follow else {}
    arms = [
        {"name": "notes", "kind": "text", "paths": ["notes/**/*.md"], **links},
        {"name": "web", "kind": "jsonl", "paths": ["web/*.jsonl"], **links},
    ]
    return build_config(
        {"data": {"arms": arms, "cache_dir": str(run / "cache")}}, {"preset": "andrea-tiny"}
    )


# ---- what an arm reads: JSON Lines lines, and the token cache -----------------------------------

#: The line bound of the JSON Lines cases (small, so that a case crosses it cheaply).
JSONL_BOUND = 1 << 16


@pytest.fixture(scope="module")
def nul_member() -> bytes:
    """A gzip member of 16 MiB of NUL bytes: repeated, a bomb of any size without a newline."""
    return gzip.compress(bytes(16 << 20), compresslevel=9)


@st.composite
def jsonl_line(draw: st.DrawFn) -> bytes:
    kind = draw(
        st.sampled_from(["object", "surrogates", "raw surrogate", "bytes", "long", "empty"])
    )
    text = draw(st.text(max_size=40))
    if kind == "object":
        return json.dumps({"text": text}).encode()
    if kind == "surrogates":  # lone escapes, valid JSON
        escape = st.sampled_from(["\\ud800", "\\udfff", "\\udbff", "\\ud83d\\ude00"])
        escapes = draw(st.lists(escape, min_size=1, max_size=4))
        return ('{"text": "' + "x".join(escapes) + json.dumps(text)[1:-1] + '"}').encode()
    if kind == "raw surrogate":  # the UTF-8 form of a surrogate, which json.loads passes
        return b'{"text": "a\xed\xa0\x80b"}'
    if kind == "bytes":
        return draw(st.binary(max_size=40)).replace(b"\n", b"")
    if kind == "long":
        fill = draw(st.sampled_from([b"\x00", b"a"]))
        return b'{"text": "' + fill * (JSONL_BOUND + draw(st.integers(-20, 20))) + b'"}'
    return b""


def _jsonl_case(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    try:
        docs = bounded(
            lambda: list(jsonl_documents([path], path.parent, "text", bound=JSONL_BOUND))
        )
    except DataError as e:
        assert path.name in str(e)
        return
    for _, text in docs:
        text.encode("utf-8")  # no lone surrogate is left
    ByteTokenizer().encode_batch([t for _, t in docs])


@FUZZ
@given(data=st.data())
def test_fuzz_links_among_arm_files(
    tmp_path: Path, atime_is_kept: bool, data: st.DataObject
) -> None:
    import tempfile

    from andrea.daemon.data.arms import arm_identity, load_arms
    from andrea.daemon.data.sources import SourceRejected

    plantings = data.draw(
        st.lists(
            st.tuples(st.sampled_from(["notes", "web"]), st.sampled_from(list(LINK_KINDS))),
            min_size=1,
            max_size=3,
        )  # fmt: skip
    )
    follow = data.draw(st.booleans())
    with tempfile.TemporaryDirectory(dir=tmp_path) as base:
        run, outside = _links_run(Path(base))
        for i, (arm, kind) in enumerate(plantings):
            _plant_link(run, outside, arm, kind, i)
        cfg = _links_config(run, follow)
        escapes = any(LINK_KINDS[kind] for _, kind in plantings) and not follow
        try:
            for spec in cfg.data.arms:
                within_alarm(arm_identity, spec, cfg.data, run, cfg.model.vocab_size)
            arms = within_alarm(load_arms, cfg.data, run, cfg.model.vocab_size)
        except Blocked:
            pytest.fail(f"reading the arms blocked ({plantings})")
        except SourceRejected as e:
            assert escapes, f"refused, though no link leaves ({plantings}): {e}"
            assert "through a link" in str(e) and 'links = "follow"' in str(e), e
        else:
            assert not escapes, f"a link out of the arm was followed ({plantings})"
            assert [a.name for a in arms] == ["notes", "web"]
        if escapes:
            secrets = list(outside.rglob("secret.*"))
            if atime_is_kept:
                assert all(p.stat().st_atime == 0 for p in secrets), "a secret was read"
            cache = run / "cache"
            leaked = [
                p
                for p in cache.rglob("*")
                if p.is_file() and SECRET_TEXT.encode() in p.read_bytes()
            ]
            assert not leaked, leaked


@FUZZ
@given(data=st.data())
def test_fuzz_jsonl_lines(tmp_path: Path, data: st.DataObject) -> None:
    lines = data.draw(st.lists(jsonl_line(), min_size=1, max_size=6))
    content = b"\n".join(lines) + data.draw(st.sampled_from([b"", b"\n"]))
    if data.draw(st.booleans()):
        _jsonl_case(tmp_path / "a.jsonl.gz", gzip.compress(content))
    else:
        _jsonl_case(tmp_path / "a.jsonl", content)


@FUZZ
@given(data=st.data())
def test_fuzz_jsonl_bombs(tmp_path: Path, nul_member: bytes, data: st.DataObject) -> None:
    before = data.draw(st.lists(jsonl_line(), max_size=3))
    head = gzip.compress(b"".join(line + b"\n" for line in before))
    members = data.draw(st.integers(1, 4))  # 16 to 64 MiB of NUL bytes, no newline
    tail = data.draw(st.sampled_from([b"", gzip.compress(b'\n{"text": "after"}\n')]))
    _jsonl_case(tmp_path / "bomb.jsonl.gz", head + nul_member * members + tail)


@pytest.fixture(scope="module")
def cached_arm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DataConfig, np.ndarray]:
    root = tmp_path_factory.mktemp("fuzz-cache")
    (root / "notes").mkdir()
    for i in range(12):
        (root / "notes" / f"n{i}.md").write_text(f"note {i}: " + "words and more words. " * (i + 3))
    data = DataConfig.model_validate(
        {
            "arms": [{"name": "notes", "kind": "text", "paths": ["notes/*.md"]}],
            "cache_dir": str(root / "cache"),
            "heldout_fraction": 0.25,
        }  # fmt: skip
    )
    (arm,) = load_arms(data, root, 256)
    return root, data, np.asarray(arm.tokens).copy()


def _entry_files(cache: Path) -> dict[str, bytes]:
    """The cache's entry files: each entry's lock file (empty, never read) aside."""
    return {n: raw for n, raw in snapshot(cache).items() if not n.endswith(".lock")}


@FUZZ
@given(data=st.data())
def test_fuzz_cache_entries(cached_arm: tuple[Path, DataConfig, np.ndarray], data: st.DataObject) -> None:  # fmt: skip
    """A damaged cache entry is never trusted: the arm is always the tokens its files encode to,
    and the entry afterwards is the one encoding wrote."""
    root, cfg, expected = cached_arm
    cache = root / "cache"
    good = _entry_files(cache)
    name = data.draw(st.sampled_from(sorted(good)))

    def ids_out_of_range(buf: bytearray, at: int) -> None:
        buf[at : at + 4] = b"\xff\xff\xff\xff"

    (cache / name).write_bytes(mutate_bytes(good[name], data, ids_out_of_range))
    try:
        (arm,) = bounded(lambda: load_arms(cfg, root, 256))
        assert np.array_equal(np.asarray(arm.tokens), expected)
        assert _entry_files(cache) == good
    finally:
        for n, raw in good.items():
            (cache / n).write_bytes(raw)
