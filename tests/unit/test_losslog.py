"""`.loss.json`: format, torn-tail repair at every byte, real kill -9, exactly-once, readers, locking."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from andrea.daemon.rundir import losslog
from andrea.daemon.rundir.losslog import (
    LossCurve,
    LossEntry,
    LossLog,
    LossLogCorrupt,
    LossLogError,
    canonical_curve,
    last_entry,
    read_curve,
    read_entries,
)
from tests.support.records import SHA, entry


def clean_bytes(entries: list[LossEntry]) -> bytes:
    """The exact file the grammar prescribes for `entries`."""
    if not entries:
        return b"[\n]\n"
    return b"[\n" + b",\n".join(e.model_dump_json().encode() for e in entries) + b"\n]\n"


def dumps(entries: list[LossEntry] | LossEntry | None) -> object:
    """Comparable form of entries (model equality would call a NaN loss unequal to itself)."""
    if entries is None or isinstance(entries, LossEntry):
        return None if entries is None else entries.model_dump_json()
    return [e.model_dump_json() for e in entries]


def strict_json(raw: bytes) -> object:
    """json.loads that rejects NaN/Infinity literals, as jq and every non-Python parser do."""

    def reject(token: str) -> object:
        raise ValueError(f"non-standard JSON literal {token}")

    return json.loads(raw, parse_constant=reject)


# ---------------------------------------------------------------- model


def test_entry_model_is_strict() -> None:
    good = entry(1).model_dump()
    for field, bad in [
        ("step", 0),
        ("segment", 0),
        ("phase", -1),
        ("tokens", 0),
        ("arm", ""),
        ("lr", math.nan),
        ("wall_time", math.inf),
        ("batch_sha256", "XYZ"),
        ("step", "3"),
    ]:
        with pytest.raises(ValidationError):
            LossEntry(**{**good, field: bad})
    with pytest.raises(ValidationError):
        LossEntry(**good, extra=1)
    with pytest.raises(ValidationError):  # only the three spellings the writer emits
        LossEntry.model_validate_json(
            entry(1).model_dump_json().replace('"loss":3.0', '"loss":"nan"')
        )
    with pytest.raises(ValidationError):
        entry(1).step = 2  # frozen


@pytest.mark.parametrize(
    "value,spelling", [(math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")]
)
def test_non_finite_loss_message_round_trip(value: float, spelling: str) -> None:
    e = entry(5, loss=value)
    text = e.model_dump_json()
    assert strict_json(text.encode())["loss"] == spelling
    back = LossEntry.model_validate_json(text)
    assert math.isnan(back.loss) if math.isnan(value) else back.loss == value
    assert isinstance(e.model_dump()["loss"], float)


@settings(max_examples=100, deadline=None)
@given(
    loss=st.floats(),
    lr=st.floats(min_value=0, allow_infinity=False),
    wall=st.floats(min_value=0, allow_infinity=False),
    arm=st.text(min_size=1, max_size=64),  # LossEntry.arm is at most 64 characters
)
def test_floats_and_strings_round_trip_exactly(
    loss: float, lr: float, wall: float, arm: str
) -> None:
    e = LossEntry(
        step=1,
        loss=loss,
        arm=arm,
        lr=lr,
        tokens=1,
        wall_time=wall,
        segment=1,
        phase=0,
        batch_sha256=None,
    )
    line = e.model_dump_json().encode()
    assert b"\n" not in line  # one entry per line, whatever the arm name
    back = LossEntry.model_validate_json(line)
    assert back == e or (math.isnan(loss) and math.isnan(back.loss))
    parsed = strict_json(line)
    if math.isfinite(loss):
        assert parsed["loss"] == loss  # ordinary JSON readers see the very same double


# ---------------------------------------------------------------- format and round trip


def test_exact_bytes_and_json_load_after_every_append(tmp_path: Path) -> None:
    path = tmp_path / ".loss.json"
    entries = [
        entry(1),
        entry(2, loss=math.nan),
        entry(3, arm='données "x}\n{"'),
        entry(4, loss=5e-324),
        entry(5, loss=-math.inf),
        entry(6, loss=1.7976931348623157e308),
        entry(7, loss=-0.0),
    ]
    with LossLog.open(path) as log:
        assert path.read_bytes() == b"[\n]\n"
        assert json.loads(path.read_bytes()) == []
        for i, e in enumerate(entries, 1):
            assert log.append(e) is True
            raw = path.read_bytes()
            assert raw == clean_bytes(entries[:i])
            loaded = strict_json(raw)
            assert len(loaded) == i and loaded[-1]["step"] == e.step
            assert raw.count(b"\n") == i + 2  # one entry per line for tail/grep
        assert len(log) == 7 and log.last == entries[-1] and (1, 3) in log
    assert strict_json(path.read_bytes())[1]["loss"] == "NaN"
    got = read_entries(path)
    assert [e.model_dump_json() for e in got] == [e.model_dump_json() for e in entries]
    assert (
        math.isnan(got[1].loss) and got[4].loss == -math.inf and math.copysign(1, got[6].loss) == -1
    )
    assert last_entry(path) == entries[-1]
    with LossLog.open(path) as log:  # reopen: index and position rebuilt from the file
        assert len(log) == 7 and log.last == entries[-1]
        assert log.append(entry(8)) is True
    assert path.read_bytes() == clean_bytes([*entries, entry(8)])


def test_append_many_is_one_write_and_empty_readers(tmp_path: Path) -> None:
    path = tmp_path / ".loss.json"
    with LossLog.open(path) as log:
        assert log.last is None and len(log) == 0
        assert log.append_many([]) == 0
        assert read_entries(path) == [] and last_entry(path) is None
        assert log.append_many(entry(s) for s in range(1, 101)) == 100
        log.sync()
    assert path.read_bytes() == clean_bytes([entry(s) for s in range(1, 101)])
    with pytest.raises(TypeError):
        with LossLog.open(path) as log:
            log.append_many([entry(101), {"step": 102}])  # type: ignore[list-item]
    assert len(read_entries(path)) == 100  # nothing of the rejected batch was written


def test_duplicate_segment_step_is_a_no_op(tmp_path: Path) -> None:
    path = tmp_path / ".loss.json"
    with LossLog.open(path) as log:
        assert log.append(entry(1)) and log.append(entry(2))
        before = path.read_bytes()
        assert log.append(entry(2, loss=9.0)) is False  # resent after a restart: first one wins
        assert path.read_bytes() == before
        assert log.append_many([entry(2), entry(3), entry(3), entry(1), entry(4)]) == 2
        assert log.append(entry(2, segment=2)) is True  # same step, new trainer life: a new entry
    with LossLog.open(path) as log:  # the index is rebuilt from the file
        assert len(log) == 5
        assert log.append(entry(3)) is False and log.append(entry(2, segment=2)) is False
    assert [(e.segment, e.step) for e in read_entries(path)] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 2),
    ]


def test_canonical_curve_two_segments(tmp_path: Path) -> None:
    path = tmp_path / ".loss.json"
    with LossLog.open(path) as log:
        log.append_many(entry(s, segment=1) for s in range(1, 11))
        # the trainer died after step 10 and resumed from the checkpoint at step 6
        log.append_many(entry(s, segment=2, loss=float(s)) for s in range(7, 13))
    curve = canonical_curve(read_entries(path))
    assert [e.step for e in curve] == list(range(1, 13))
    assert [e.segment for e in curve] == [1] * 6 + [2] * 6
    assert [e.loss for e in curve[6:]] == [float(s) for s in range(7, 13)]
    # highest segment wins even if an older one comes later in the file; ties go to file order
    assert canonical_curve([entry(1, segment=3), entry(1, segment=2)])[0].segment == 3
    assert canonical_curve([entry(1, loss=1.0), entry(1, loss=2.0)])[0].loss == 2.0


# ---------------------------------------------------------------- torn tail at every byte


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A real directory on tmpfs when there is one: the every-byte loops below make thousands of real
    fsync calls, which cost milliseconds each on a busy shared disk and nothing on tmpfs."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="losslog-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def _torn_states(n_before: int, batch: list[LossEntry]):
    """Every state a kill at any byte of the last write can leave: (state bytes, entries that must survive)."""
    base = [entry(s) for s in range(1, n_before + 1)]
    before = clean_bytes(base)
    after = clean_bytes(base + batch)
    pos = len(before) - 3
    written = after[pos:]
    # file offset just past each entry's "}" in `after`
    ends = [len(clean_bytes(base + batch[:k])) - 3 for k in range(1, len(batch) + 1)]
    states = []
    for j in range(len(written) + 1):
        complete = base + [e for e, end in zip(batch, ends) if end <= pos + j]
        # SIGKILL inside pwrite: a prefix of the new bytes over the old terminator
        states.append((before[:pos] + written[:j] + before[pos + j :], complete))
        # the file cut at that byte (the brief's truncation model), and with zeroed blocks after it
        states.append((after[: pos + j], complete))
        states.append((after[: pos + j] + b"\0" * 700, complete))
    return states


@pytest.mark.parametrize(
    "n_before,batch",
    [
        (4, [entry(5, arm='x}"\n{"step":1}')]),  # a "}" inside a string must not fool the scan
        (0, [entry(1, arm="données")]),  # torn first entry -> empty log; torn UTF-8
        (3, [entry(4), entry(5, loss=math.nan), entry(6)]),  # append_many torn inside the batch
    ],
    ids=["last-entry", "first-entry", "batch"],
)
def test_torn_tail_repaired_at_every_byte(
    fast_dir: Path, n_before: int, batch: list[LossEntry]
) -> None:
    path = fast_dir / ".loss.json"
    for state, complete in _torn_states(n_before, batch):
        path.write_bytes(state)
        # readers tolerate the torn tail and do not touch the file
        assert dumps(read_entries(path)) == dumps(complete), state[-80:]
        assert dumps(last_entry(path)) == dumps(complete[-1] if complete else None)
        assert path.read_bytes() == state
        with LossLog.open(path) as log:
            assert path.read_bytes() == clean_bytes(complete), state[-80:]
            assert len(log) == len(complete) and dumps(log.last) == dumps(
                complete[-1] if complete else None
            )
            assert log.append(entry(99, segment=2)) is True
        assert strict_json(path.read_bytes())[-1]["step"] == 99
        assert path.read_bytes() == clean_bytes([*complete, entry(99, segment=2)])


def test_all_zero_tail_far_from_the_last_entry(tmp_path: Path) -> None:
    path = tmp_path / ".loss.json"
    entries = [entry(s) for s in range(1, 51)]
    path.write_bytes(
        clean_bytes(entries)[:-3] + b',\n{"st' + b"\0" * 100_000
    )  # tail scan must read back past it
    with LossLog.open(path):
        pass
    assert path.read_bytes() == clean_bytes(entries)


# ---------------------------------------------------------------- not a torn tail: refuse, touch nothing


def _lines_file(tmp_path: Path, n: int = 5) -> tuple[Path, bytes]:
    path = tmp_path / ".loss.json"
    raw = clean_bytes([entry(s) for s in range(1, n + 1)])
    path.write_bytes(raw)
    return path, raw


def _line_offset(raw: bytes, index: int) -> int:
    """Byte offset of entry line `index` (0-based)."""
    offset = 2
    for _ in range(index):
        offset = raw.index(b"\n", offset) + 1
    return offset


@pytest.mark.parametrize(
    "name,edit,bad_line",
    [
        ("garbage", lambda r, o: r[:o] + b"garbage,\n" + r[o:], 2),
        ("schema", lambda r, o: r[:o] + b'{"step":3,"extra":1},\n' + r[o:], 2),
        ("missing comma", lambda r, o: r[: o - 2] + r[o - 1 :], 1),
        ("nul in middle", lambda r, o: r[:o] + b"\0" * 5 + r[o + 5 :], 2),
        (
            "torn tail too",
            lambda r, o: (r[:o] + b"xx" + r[o:])[:-10],
            2,
        ),  # no repair before the whole file is valid
        # valid JSON, but not one entry per line: the tail scan could not rely on it
        ("joined lines", lambda r, o: r[: o - 1] + r[o:], 1),
        ("split entry", lambda r, o: r[:o] + r[o:].replace(b',"loss"', b',\n"loss"', 1), 2),
    ],
)
def test_garbage_in_the_middle_is_refused_with_offset(
    tmp_path: Path, name: str, edit, bad_line: int
) -> None:
    path, raw = _lines_file(tmp_path)
    bad = edit(raw, _line_offset(raw, 2))
    path.write_bytes(bad)
    for action in (LossLog.open, read_entries, read_curve):
        with pytest.raises(LossLogCorrupt) as info:
            action(path)
        assert info.value.offset == _line_offset(bad, bad_line), str(info.value)
        assert f"byte offset {info.value.offset}" in str(info.value)
        assert path.read_bytes() == bad
    # last_entry reads only the tail, so garbage in the middle does not concern it
    assert last_entry(path) is not None


def test_records_with_and_without_an_evaluation(tmp_path: Path) -> None:
    """The record after an evaluation carries it (`heldout`); every other record leaves the key out,
    so its bytes are those it always had. Both kinds open, read and repair alike; a key that is
    neither a field nor `heldout` is still damage."""
    evaluated = entry(3).model_copy(update={"heldout": {"code": 2.5, "docs": math.nan}})
    entries = [entry(1), entry(2), evaluated, entry(4)]
    path = tmp_path / ".loss.json"
    raw = clean_bytes(entries)
    assert b'"heldout"' not in clean_bytes([entry(2)])
    assert b'"heldout":{"code":2.5,"docs":"NaN"}}' in raw
    path.write_bytes(raw[:-3] + b',\n{"step":5,')  # an append torn over the terminator
    with LossLog.open(path) as log:
        assert len(log) == 4 and log.append(entry(5))
    got = read_entries(path)
    assert dumps(got) == dumps([*entries, entry(5)]) and math.isnan(got[2].heldout["docs"])
    assert read_curve(path).step.tolist() == [1, 2, 3, 4, 5]
    offset = _line_offset(path.read_bytes(), 1)
    bad = path.read_bytes()[:offset] + path.read_bytes()[offset:].replace(
        b'"batch_sha256":null', b'"batch_sha256":null,"held":{}', 1
    )
    path.write_bytes(bad)
    for action in (LossLog.open, read_entries, read_curve):
        with pytest.raises(LossLogCorrupt):
            action(path)


def test_field_error_in_the_middle(tmp_path: Path) -> None:
    """open checks what the writer relies on (JSON, layout, field names, segment and step); readers the rest."""
    path, raw = _lines_file(tmp_path)
    offset = _line_offset(raw, 2)
    bad = raw[:offset] + raw[offset:].replace(b'"tokens":4096', b'"tokens":0', 1)
    path.write_bytes(bad)
    with pytest.raises(LossLogCorrupt, match="tokens") as info:
        read_entries(path)
    assert info.value.offset == offset
    with LossLog.open(path) as log:
        assert len(log) == 5 and log.append(entry(6))
    for bad_key in (b'"segment":0', b'"segment":"1"'):
        path.write_bytes(raw[:offset] + raw[offset:].replace(b'"segment":1', bad_key, 1))
        with pytest.raises(LossLogCorrupt) as info:
            LossLog.open(path)
        assert info.value.offset == offset


@pytest.mark.parametrize(
    "name,content",
    [
        (
            "pretty-printed",
            lambda entries: json.dumps(
                [e.model_dump(mode="json") for e in entries], indent=2
            ).encode(),
        ),
        (
            "one line",
            lambda entries: json.dumps([e.model_dump(mode="json") for e in entries]).encode(),
        ),
        ("after terminator", lambda entries: clean_bytes(entries) + b"more\n"),
        ("double terminator", lambda entries: clean_bytes(entries) + b"]\n"),
        ("invalid last entry", lambda entries: clean_bytes(entries)[:-3] + b',\n{"step":9}\n]\n'),
        ("no header", lambda entries: clean_bytes(entries)[2:]),
        ("text", lambda entries: b"hello world\n"),
    ],
)
def test_foreign_files_are_refused_untouched(tmp_path: Path, name: str, content) -> None:
    path = tmp_path / ".loss.json"
    raw = content([entry(s) for s in range(1, 4)])
    path.write_bytes(raw)
    with pytest.raises(LossLogCorrupt, match="byte offset"):
        LossLog.open(path)
    with pytest.raises(LossLogCorrupt):
        read_entries(path)
    with pytest.raises(LossLogCorrupt):
        read_curve(path)
    assert path.read_bytes() == raw


# ---------------------------------------------------------------- read_curve: the canonical curve as columns


COLUMN_TYPES = {
    "step": np.int64,
    "loss": np.float64,
    "arm": object,
    "lr": np.float64,
    "tokens": np.int64,
    "wall_time": np.float64,
    "segment": np.int64,
    "phase": np.int64,
    "batch_sha256": object,
}


def assert_curve_of_entries(path: Path) -> LossCurve:
    """read_curve(path) is canonical_curve(read_entries(path)), field by field, and leaves the file as it was."""
    before = path.read_bytes()
    entries = read_entries(path)
    expected = canonical_curve(entries)
    curve = read_curve(path)
    assert path.read_bytes() == before
    assert curve.entries_read == len(entries) and len(curve) == len(expected)
    for name, dtype in COLUMN_TYPES.items():
        column = getattr(curve, name)
        want = [getattr(e, name) for e in expected]
        assert column.dtype == dtype and column.shape == (len(expected),), name
        if dtype is np.float64:  # NaN equals NaN here, and -0.0 is told from 0.0
            assert (
                np.array_equal(column, want, equal_nan=True)
                and (np.signbit(column) == np.signbit(want)).all()
            ), name
        else:
            assert column.tolist() == want, name
    assert dumps([curve.entry(i) for i in range(len(curve))]) == dumps(expected)
    return curve


def test_read_curve_two_segments_and_repeated_pairs(tmp_path: Path) -> None:
    path = tmp_path / ".loss.json"
    # LossLog refuses a repeated (segment, step), so the file is written by hand: segment 1 trains 1-10,
    # segment 2 resumes from step 6, an older segment's entries come later in the file, and pairs repeat
    # (the last in file order wins among equals)
    entries = (
        [entry(s, segment=1) for s in range(1, 11)]
        + [entry(s, segment=2, loss=float(s)) for s in range(7, 13)]
        + [
            entry(11, segment=1, loss=-1.0),
            entry(13, segment=1),
            entry(8, segment=2, loss=80.0),
            entry(3, segment=1, loss=30.0),
            entry(8, segment=2, loss=88.0),
            entry(2, segment=3, arm="other"),
        ]
    )
    path.write_bytes(clean_bytes(entries))
    curve = assert_curve_of_entries(path)
    assert curve.entries_read == len(entries) and curve.step.tolist() == list(range(1, 14))
    assert curve.segment.tolist() == [1, 3, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 1]
    assert curve.loss[[2, 7]].tolist() == [30.0, 88.0] and curve.arm[1] == "other"
    assert curve.entry(-1) == entry(13, segment=1) and curve.entry(7) == entry(
        8, segment=2, loss=88.0
    )
    with pytest.raises(IndexError):
        curve.entry(13)


def test_read_curve_values_the_model_takes(tmp_path: Path) -> None:
    path = tmp_path / ".loss.json"
    entries = [
        entry(1),
        entry(2, loss=math.nan),
        entry(3, loss=math.inf),
        entry(4, loss=-math.inf),
        entry(5, loss=-0.0),
        entry(6, loss=5e-324),
        entry(7, arm='données "x}\n{"'),
        entry(8, phase=3),
    ]
    raw = clean_bytes(entries)
    path.write_bytes(raw)
    curve = assert_curve_of_entries(path)
    assert math.isnan(curve.loss[1]) and curve.loss[2:4].tolist() == [math.inf, -math.inf]
    assert curve.batch_sha256.tolist() == [SHA if s % 2 else None for s in range(1, 9)]
    # hand-edited but valid: integers for float fields, fields in another order
    edited = raw.replace(b'"lr":0.0003', b'"lr":0', 1).replace(
        b'"wall_time":1750000002.0', b'"wall_time":1750000002'
    )
    start = _line_offset(edited, 2)
    end = edited.index(b",\n", start)
    fields = json.loads(edited[start:end])
    fields["step"] = fields.pop("step")  # now the last field
    edited = edited[:start] + json.dumps(fields, separators=(",", ":")).encode() + edited[end:]
    path.write_bytes(edited)
    assert isinstance(losslog._fast_curve(edited), LossCurve)  # still the fast path
    curve = assert_curve_of_entries(path)
    assert curve.lr[0] == 0.0 and curve.wall_time[1] == 1_750_000_002.0 and curve.step[2] == 3
    # a bare NaN literal is not strict JSON, but the model's parser takes it: so does read_curve
    path.write_bytes(raw.replace(b'"loss":"NaN"', b'"loss":NaN'))
    assert math.isnan(assert_curve_of_entries(path).loss[1])


def test_read_curve_empty_logs(tmp_path: Path) -> None:
    path = tmp_path / ".loss.json"
    for content in (b"", b"[", b"[\n]\n", b'[\n{"st'):
        path.write_bytes(content)
        curve = assert_curve_of_entries(path)
        assert len(curve) == 0 and not curve and curve.entries_read == 0
    with pytest.raises(FileNotFoundError):
        read_curve(tmp_path / "absent.json")


@pytest.mark.parametrize(
    "n_before,batch",
    [
        (0, [entry(1, arm="données")]),
        (
            3,
            [entry(4), entry(2, segment=2, loss=math.nan), entry(4, segment=2)],
        ),  # the torn batch replaces steps
    ],
    ids=["first-entry", "batch"],
)
def test_read_curve_torn_tail_at_every_byte(
    fast_dir: Path, n_before: int, batch: list[LossEntry]
) -> None:
    path = fast_dir / ".loss.json"
    for state, complete in _torn_states(n_before, batch):
        path.write_bytes(state)
        assert len(assert_curve_of_entries(path)) == len({e.step for e in complete}), state[-80:]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.builds(
            LossEntry,
            step=st.integers(1, 30),
            loss=st.floats(),
            arm=st.text(min_size=1, max_size=5),
            lr=st.floats(min_value=0, allow_infinity=False),
            tokens=st.integers(1, 2**53),
            wall_time=st.floats(min_value=0, allow_infinity=False),
            segment=st.integers(1, 4),
            phase=st.integers(0, 5),
            batch_sha256=st.none()
            | st.binary(min_size=1).map(lambda b: hashlib.sha256(b).hexdigest()),
        ),
        max_size=40,
    )
)
def test_read_curve_matches_canonical_curve(entries: list[LossEntry]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ".loss.json"
        raw = clean_bytes(entries)
        path.write_bytes(raw)
        assert_curve_of_entries(path)
        if entries:  # every file the writer can write takes the fast path, not the models
            assert isinstance(losslog._fast_curve(raw), LossCurve)


def _with_value(raw: bytes, index: int, field: str, value: bytes) -> bytes:
    """`raw` with the value of `field` in entry line `index` replaced by the JSON text `value`."""
    start = _line_offset(raw, index)
    end = raw.index(b"\n", start)
    line, count = re.subn(
        rb'"%s":("[^"]*"|[^,}]*)' % field.encode(),
        b'"%s":%s' % (field.encode(), value),
        raw[start:end],
    )
    assert count == 1
    return raw[:start] + line + raw[end:]


@pytest.mark.parametrize(
    "field,value",
    [
        ("step", b"0"),
        ("step", b"3.0"),
        ("step", b"true"),
        ("step", b'"3"'),
        ("step", b"null"),
        ("loss", b'"nan"'),
        ("loss", b'"inf"'),
        ("loss", b'"1.5"'),
        ("loss", b"true"),
        ("loss", b"null"),
        ("loss", b"[1]"),
        ("loss", b"{}"),
        ("arm", b'""'),
        ("arm", b"1"),
        ("arm", b"null"),
        ("lr", b"-0.001"),
        ("lr", b"1e999"),
        ("lr", b'"NaN"'),
        ("lr", b"false"),
        ("tokens", b"0"),
        ("tokens", b"true"),
        ("tokens", b"4096.0"),
        ("tokens", b"-5"),
        ("wall_time", b"-1"),
        ("wall_time", b"-1e999"),
        ("segment", b"0"),
        ("segment", b'"1"'),
        ("phase", b"-1"),
        ("phase", b"0.5"),
        ("batch_sha256", b'"%s"' % SHA.upper().encode()),
        ("batch_sha256", b'"%s"' % SHA[:63].encode()),
        ("batch_sha256", b'"%sg"' % SHA[:63].encode()),
        ("batch_sha256", b'"%s0"' % SHA.encode()),
        ("batch_sha256", b'""'),
        ("batch_sha256", b"0"),
        ("batch_sha256", b"false"),
        ("batch_sha256", b'"%s"' % ("é" * 64).encode()),
    ],
)
def test_read_curve_reports_a_bad_value_as_read_entries_does(
    tmp_path: Path, field: str, value: bytes
) -> None:
    path, raw = _lines_file(tmp_path)
    bad = _with_value(raw, 2, field, value)
    path.write_bytes(bad)
    with pytest.raises(LossLogCorrupt) as expected:
        read_entries(path)
    assert expected.value.offset == _line_offset(raw, 2) and field in str(expected.value)
    with pytest.raises(LossLogCorrupt) as info:
        read_curve(path)
    assert (info.value.offset, info.value.reason, str(info.value)) == (
        expected.value.offset,
        expected.value.reason,
        str(expected.value),
    )
    assert path.read_bytes() == bad


@pytest.mark.parametrize(
    "name,edit",
    [
        ("renamed", lambda line: line.replace(b'"phase"', b'"Phase"')),
        ("extra", lambda line: line.replace(b"{", b'{"note":"x",')),
        ("missing", lambda line: line.replace(b',"phase":0', b"")),
        ("duplicate", lambda line: line.replace(b',"phase":0', b',"phase":0,"phase":0')),
        ("not an object", lambda line: b"[3]"),
    ],
)
def test_read_curve_reports_other_fields_as_read_entries_does(
    tmp_path: Path, name: str, edit
) -> None:
    path, raw = _lines_file(tmp_path)
    start = _line_offset(raw, 1)
    end = raw.index(b",\n", start)
    bad = raw[:start] + edit(raw[start:end]) + raw[end:]
    path.write_bytes(bad)
    if name == "duplicate":  # JSON keeps the last of a repeated key: both readers take it
        assert_curve_of_entries(path)
        return
    with pytest.raises(LossLogCorrupt) as expected:
        read_entries(path)
    with pytest.raises(LossLogCorrupt) as info:
        read_curve(path)
    assert str(info.value) == str(expected.value) and info.value.offset == start


def test_integers_beyond_their_bound_are_damage(tmp_path: Path) -> None:
    """Steps, segments and phases fit the int32 header, tokens a float64 column: a larger value (a
    hostile peer's 10^30 once made history and plot fail for the life of the run) is reported as a
    damaged entry by both readers, never an OverflowError."""
    path, raw = _lines_file(tmp_path)
    for field, bad, good in (("tokens", 2**53 + 1, 2**53), ("step", 10**30, 2**31 - 1)):
        path.write_bytes(_with_value(raw, 2, field, b"%d" % bad))
        with pytest.raises(LossLogCorrupt, match=field):
            read_entries(path)
        with pytest.raises(LossLogCorrupt, match=field):
            read_curve(path)
        path.write_bytes(_with_value(raw, 2, field, b"%d" % good))
        assert getattr(assert_curve_of_entries(path), field)[-1 if field == "step" else 2] == good


# ---------------------------------------------------------------- locking and failed writes


def test_failed_write_poisons_the_handle_and_reopen_repairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ".loss.json"
    log = LossLog.open(path)
    log.append_many(entry(s) for s in range(1, 4))
    real_pwrite = os.pwrite

    def disk_full(fd: int, data: bytes, offset: int) -> int:
        real_pwrite(fd, bytes(data[:40]), offset)  # part of the write lands, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(losslog.os, "pwrite", disk_full)
    with pytest.raises(OSError):
        log.append(entry(4))  # the undo of the torn append fails too: the next open repairs it
    monkeypatch.undo()
    with pytest.raises(LossLogError, match="reopen"):
        log.append(entry(5))
    log.close()
    with LossLog.open(path) as log:
        assert len(log) == 3
        assert log.append(entry(4)) is True
    assert path.read_bytes() == clean_bytes([entry(s) for s in range(1, 5)])


@pytest.mark.parametrize("n_before", [0, 3])
def test_failed_append_is_undone_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, n_before: int
) -> None:
    """A full disk fails the append after part of it landed; the cut that undoes it frees that
    space, so the file is whole again before the writer even exits (issue 24, item 10)."""
    path = tmp_path / ".loss.json"
    before = [entry(s) for s in range(1, n_before + 1)]
    log = LossLog.open(path)
    log.append_many(before)
    real_pwrite, calls = os.pwrite, []

    def full_once(fd: int, data: bytes, offset: int) -> int:
        calls.append(offset)
        if len(calls) > 1:
            return real_pwrite(fd, data, offset)
        real_pwrite(fd, bytes(data[:40]), offset)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(losslog.os, "pwrite", full_once)
    with pytest.raises(OSError):
        log.append_many([entry(4), entry(5)])
    monkeypatch.undo()
    assert path.read_bytes() == clean_bytes(before)
    assert json.loads(path.read_bytes()) == [e.model_dump(mode="json") for e in before]
    with pytest.raises(LossLogError, match="reopen"):
        log.append(entry(6))
    log.close()
    caplog.clear()
    with LossLog.open(path) as log:
        assert len(log) == len(before)
    assert "repaired" not in caplog.text


# ---------------------------------------------------------------- a real kill -9
