"""Shared fixtures and the tiers' rules: the folder decides the tier. Every test under tests/process/
is marked `process`; a test file directly in tests/ (outside both tiers), or a `process` mark under
tests/unit/, stops the collection. So `-m "not process"` and `tests/unit` select the same tests."""

from __future__ import annotations

import compileall
import os
from pathlib import Path

import pytest

from tests.support.daemons import LIVE
from tests.support.scheduling import FileSeconds, load_seconds, longest_first

# pytester runs pytest in-process: tests/unit/test_tiers.py checks the rules below with it.
pytest_plugins = ["pytester"]


@pytest.fixture(scope="session", autouse=True)
def _default_cache_outside_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The default token cache (`$XDG_CACHE_HOME/andrea`), which `andreactl tokenizer train` warms
    when a test gives no --cache-dir, lies in the session's temporary directory, never in $HOME."""
    if "XDG_CACHE_HOME" not in os.environ:
        os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tokenized-corpus cache for the whole session: the first trainer builds it."""
    shared = os.environ.get("ANDREA_TEST_CACHE")
    return Path(shared) if shared else tmp_path_factory.mktemp("cache")


#: Set on the controller when -n hands out files longest first; each worker is told (workerinput).
_LONGEST_FIRST = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-file-seconds",
        action="store_true",
        help="write each test file's seconds to tests/support/file_seconds.json, the lengths "
        "by which -n hands out the files, longest first (tests/support/scheduling.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """With -n: each test file on one worker, so a file's module fixtures (a reference run trained
    once for its tests) are built once, not once per worker, and the files handed out longest
    first (tests/support/scheduling.py). Set here rather than in addopts, where `--dist` would stop
    a pytest without pytest-xdist from starting; an explicit --dist wins."""
    explicit = any(a.startswith(("--dist", "-d")) for a in config.invocation_params.args)
    if config.pluginmanager.hasplugin("xdist") and not explicit:
        if config.getoption("dist", "no") == "load":
            config.option.dist = "loadfile"
            # xdist's own order (most tests first) would undo the one the workers collect in.
            config.option.loadscopereorder = False
            config.stash[_LONGEST_FIRST] = True
    if config.getoption("record_file_seconds") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(FileSeconds(), "file-seconds")
    if not hasattr(config, "workerinput"):
        _compile_the_packages(config.rootpath)


#: The packages every daemon and andreactl the tests start imports.
PACKAGES = ("daemon", "control", "protocol")


def _compile_the_packages(root: Path) -> None:
    """Writes the packages' bytecode (__pycache__, ignored by git) once, before any test starts a
    process. Where PYTHONDONTWRITEBYTECODE is set no process writes it, so each of the suite's
    hundreds of trainer and andreactl starts compiled some 90 modules from source again (0.1 s of
    CPU each, measured); a user's install has its bytecode. Up-to-date files are skipped."""
    for package in PACKAGES:
        compileall.compile_dir(root / package, quiet=2)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist, on the controller: tells each worker to collect in the longest-first order."""
    node.workerinput["longest_first"] = node.config.stash.get(_LONGEST_FIRST, False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The folder is the tier: tests/process/ items get the `process` mark; a test outside
    tests/unit/ and tests/process/, or one marked `process` in tests/unit/, is refused. Under -n,
    the workers collect the files longest first."""
    tests = config.rootpath / "tests"
    unit, process = tests / "unit", tests / "process"
    refused = []
    for item in items:
        path = Path(item.path)
        if process in path.parents:
            item.add_marker(pytest.mark.process)
        elif unit not in path.parents:
            refused.append(f"{item.nodeid}: a test outside tests/unit/ and tests/process/")
        elif item.get_closest_marker("process"):
            refused.append(f"{item.nodeid}: marked `process` in tests/unit/")
    if refused:
        raise pytest.UsageError(
            "the folder decides a test's tier: tests/unit/ for tests that start no process, "
            "tests/process/ for real processes (which are marked `process` there, never by hand):\n  "
            + "\n  ".join(refused)
        )
    if getattr(config, "workerinput", {}).get("longest_first"):
        items[:] = longest_first(items, load_seconds())


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """A failing test must not leave a daemon running into the next test (or past CI)."""
    yield
    while LIVE:
        proc = LIVE.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def real_systemd(tmp_path_factory: pytest.TempPathFactory):
    """A real systemd booted once for the module, PID 1 of private namespaces, with the units
    installed by scripts/install-units.sh (tests/support/realsystemd.py); killed at the end. Skips, with
    the reason, where it cannot boot (no root, no unshare, no systemd)."""
    from tests.support.realsystemd import SystemdMachine, unavailable

    if why := unavailable():
        pytest.skip(why)
    machine = SystemdMachine(tmp_path_factory.mktemp("systemd"))
    machine.boot()
    try:
        yield machine
    finally:
        machine.kill()


@pytest.fixture(scope="session")
def audited_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A finished real run with two restarts, a pivot, a zombie arm and an audit checkpoint
    (tests/support/audited_run.py). Shared and read-only: a test that changes it copies it first."""
    from tests.support.audited_run import make_audited_run

    return make_audited_run(tmp_path_factory.mktemp("audited"), cache_dir)
