"""`andreactl generate`: text from a run's checkpoint and from both export kinds, the same text for
the same seed, the window sliding, nothing written, and each bad input refused with exit 2."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from andrea.control import andreactl
from andrea.control.export import bundle as ex
from tests.support.daemons import run_trainer


def _quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[dict[str, Path]]:
    """A 10-step run (checkpoints at 5 and 10) and its two exports of step 10. The module's
    in-process generations run on one torch thread, as the test trainer does: andrea-tiny's
    matrices are too small to share, and on a loaded 2-core machine torch's default of one
    thread a core spent seconds of CPU spinning at each layer (13 ms a linear layer)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("run")
    res = run_trainer(run, cache_dir, "--max-steps", "10", "--checkpoint-every", "5", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path_factory.mktemp("exports")
    ex.export_checkpoint(run, out / "andrea", progress=_quiet)
    ex.export_checkpoint(run, out / "hf", progress=_quiet, hf=True)
    try:
        yield {"run": run, "andrea": out / "andrea", "hf": out / "hf"}
    finally:
        torch.set_num_threads(threads)


def _generate(capsys, *argv: str) -> tuple[int, dict | None, str]:
    try:
        code = andreactl.main(["--json", "generate", *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    doc = json.loads(out) if out.strip() else None
    return code, doc, err


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def test_every_source_gives_the_same_text_for_the_same_seed(sources, capsys) -> None:
    before = _snapshot(sources["run"])
    common = ["--prompt", "def ", "--prompt", "The ", "--max-new-tokens", "24", "--seed", "7"]
    texts = {}
    for name, flag in (("run", "--run-dir"), ("andrea", "--export-dir"), ("hf", "--export-dir")):
        code, doc, err = _generate(capsys, flag, str(sources[name]), *common)
        assert code == 0, err
        assert doc["step"] == 10 and len(doc["outputs"]) == 2
        assert all(len(o["tokens"]) == 24 for o in doc["outputs"])
        texts[name] = [o["text"] for o in doc["outputs"]]
    assert texts["run"] == texts["andrea"] == texts["hf"]
    code, again, _ = _generate(capsys, "--run-dir", str(sources["run"]), *common)
    assert code == 0 and [o["text"] for o in again["outputs"]] == texts["run"]
    other = [*common[:-1], "8"]
    code, doc, _ = _generate(capsys, "--run-dir", str(sources["run"]), *other)
    assert code == 0 and [o["tokens"] for o in doc["outputs"]] != [
        o["tokens"] for o in again["outputs"]
    ]
    assert _snapshot(sources["run"]) == before, "generate wrote into the run directory"


def test_a_step_and_greedy_decoding(sources, capsys) -> None:
    argv = ["--run-dir", str(sources["run"]), "--step", "5", "--prompt", "x", "--temperature", "0"]
    code, doc, err = _generate(capsys, *argv, "--max-new-tokens", "8")
    assert code == 0, err
    assert doc["step"] == 5 and doc["temperature"] == 0.0
    code, again, _ = _generate(capsys, *argv, "--max-new-tokens", "8", "--seed", "99")
    assert again["outputs"][0]["tokens"] == doc["outputs"][0]["tokens"], "greedy ignores the seed"
    # A top-p that is 0 in float32 keeps the most likely token alone: greedy, not a failed draw.
    tiny = [*argv[:-2], "--temperature", "1", "--top-p", "1e-46", "--max-new-tokens", "8"]
    code, nucleus, err = _generate(capsys, *tiny)
    assert code == 0, err
    assert nucleus["outputs"][0]["tokens"] == doc["outputs"][0]["tokens"]
    # --threads is torch's thread count for the command (the module runs on one: set it back).
    import torch

    try:
        code, two, err = _generate(capsys, *argv, "--max-new-tokens", "8", "--threads", "2")
        assert code == 0 and torch.get_num_threads() == 2, err
    finally:
        torch.set_num_threads(1)
    assert two["outputs"][0]["tokens"] == doc["outputs"][0]["tokens"]


def test_a_damaged_newest_checkpoint_is_named_when_skipped(sources, capsys, tmp_path) -> None:
    run = tmp_path / "run"
    shutil.copytree(sources["run"], run, ignore=shutil.ignore_patterns(".sock*", "*.lock"))
    payload = run / "step_000010.bin"
    payload.write_bytes(payload.read_bytes()[:-4])
    code, doc, err = _generate(capsys, "--run-dir", str(run), "--prompt", "a",
                               "--max-new-tokens", "2")  # fmt: skip
    assert code == 0 and doc["step"] == 5, err
    assert "WARNING: skipped damaged checkpoint step_000010.json: " in err, err


def test_the_window_slides_and_says_so(sources, capsys, tmp_path: Path) -> None:
    long = tmp_path / "long.txt"
    long.write_text("word " * 100)  # 500 bytes: longer than andrea-tiny's window of 64
    argv = ["--run-dir", str(sources["run"]), "--prompt-file", str(long), "--max-new-tokens", "70"]
    code, doc, err = _generate(capsys, *argv, "--top-k", "5", "--top-p", "0.9")
    assert code == 0, err
    assert "has 500 tokens, more than the window of 64: the model sees its last 64" in err
    assert doc["outputs"][0]["window_slid"] and len(doc["outputs"][0]["tokens"]) == 70
    code, doc, err = _generate(capsys, "--run-dir", str(sources["run"]), "--prompt", "ab",
                               "--max-new-tokens", "70")  # fmt: skip
    assert code == 0 and "2 + 70 tokens exceed the window of 64" in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--step", "7", "--prompt", "a"], "has no checkpoint of step 7"),
        (["--prompt-file", "{tmp}/missing.txt"], "missing.txt: cannot be read"),
        (["--prompt-file", "{tmp}/latin1.txt"], "latin1.txt: not UTF-8 text"),
        ([], "give a prompt"),
        (["--prompt", ""], "prompt 1 is empty"),
        (["--prompt", "a", "--top-p", "1.5"], "--top-p 1.5: must be in (0, 1]"),
        (["--prompt", "a", "--temperature", "-1"], "--temperature -1.0"),
        (["--prompt", "caf\udce9"], "--prompt 1: not UTF-8 text (byte 3 of the argument)"),
        (["--prompt", "a", "--seed", "-1"], "--seed -1: must be from 0 to 2**63 - 1"),
        (["--prompt", "a", "--seed", str(2**64)], f"--seed {2**64}: must be from 0"),
        (["--prompt", "a", "--device", "meta"], "--device meta: a model generates on cpu or"),
        (["--prompt", "a", "--max-new-tokens", "1e12"], "invalid int value"),
        (["--prompt", "a", "--max-new-tokens", str(10**12)], "must be from 0 to 65,536"),
        (["--prompt", "a", "--threads", "0"], "--threads is 0: 1 to 1,024"),
        (["--prompt", "a", "--threads", "5000"], "--threads is 5000: 1 to 1,024"),
    ],
)
def test_bad_inputs_are_usage_errors_naming_what(
    sources, capsys, tmp_path: Path, argv: list[str], said: str
) -> None:
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, doc, err = _generate(capsys, "--run-dir", str(sources["run"]), *argv)
    assert code == 2 and said in err, err
    if said != "invalid int value":  # argparse's own refusal: its usage, no JSON document
        assert doc["exit_code"] == 2 and said in doc["error"]


def test_a_source_is_needed_and_a_step_belongs_to_a_run(sources, capsys, tmp_path: Path) -> None:
    env = os.environ.pop("ANDREA_RUN_DIR", None)
    try:
        code, _, err = _generate(capsys, "--prompt", "a")
        assert code == 2 and "give one of --run-dir RUN or --export-dir FOLDER" in err
    finally:
        if env is not None:
            os.environ["ANDREA_RUN_DIR"] = env
    code, _, err = _generate(capsys, "--export-dir", str(sources["hf"]), "--step", "5",
                             "--prompt", "a")  # fmt: skip
    assert code == 2 and "an export holds one" in err
    code, _, err = _generate(capsys, "--export-dir", str(tmp_path), "--prompt", "a")
    assert code == 2 and f"no checkpoint in {tmp_path}" in err
    hub = sources["hf"] / "hf"
    code, _, err = _generate(capsys, "--export-dir", str(hub), "--prompt", "a")
    assert code == 2 and f"give --export-dir {sources['hf']}" in err, err
