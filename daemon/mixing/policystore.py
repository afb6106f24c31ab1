"""The one policy in force, kept in the run directory (`RUN_DIR/policy.toml`).

A restart must neither undo a pivot nor pivot by accident, so the policy a run uses lives with the
run, not on the command line:

- the first start writes the policy it was given (or the default, no caps or floors) there;
- a plain restart uses it;
- a `--policy FILE` that differs from it is refused, naming both fingerprints and every differing
  setting, unless the operator says explicitly that it is a pivot (`--pivot`): then FILE replaces
  the run's policy and the proxy starts a new phase at the newest checkpoint;
- editing `RUN_DIR/policy.toml` while the proxy is stopped is the seed's manual pivot, and is
  detected by the proxy against the fingerprint in `.state.json`.

A run written before the file existed gets it from its `.state.json`, so its policy is kept.

The reward: a policy text that does not name one (`reward = ...`) takes the run's — the one its
`policy.toml` names, else the one of its `.state.json`, else, in a run with logged steps but neither,
ODM's "loss", and in a new run `NEW_RUN_REWARD`. So a restart or pivot with the file a run was started
with keeps the reward it has, whether made by command or by editing `policy.toml`, and the runs written
before the choice existed (whose files name none, and whose states say "loss") keep theirs, and their
resume stays bit for bit. Whatever the run's `policy.toml` says is written back naming the reward, so
that the file alone says it from then on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from andrea.daemon.mixing.policy import (
    IMPLICIT_REWARD,
    NEW_RUN_REWARD,
    TARGETED_REWARDS,
    Policy,
    PolicyError,
    Reward,
    differences,
    parse_policy,
    read_policy_text,
)
from andrea.daemon.mixing.proxyfiles import MAX_STATE_BYTES
from andrea.daemon.rundir.boundedio import read_json
from andrea.daemon.rundir.durable import atomic_write_bytes
from andrea.daemon.rundir.layout import LOSS_FILE, POLICY_FILE, STATE_FILE


@dataclass(frozen=True)
class Resolved:
    """The policy to run with, and the text to (re)write as the run's policy file, if any."""

    policy: Policy
    write: str | None
    pivot: bool


def _state_policy(run_dir: Path) -> Policy | None:
    """The policy recorded in `.state.json`, or None (absent or unreadable: the proxy reports
    that itself when it starts)."""
    try:
        data = read_json(run_dir / STATE_FILE, MAX_STATE_BYTES)
        return Policy.model_validate(data["bandit"]["policy"])
    except (OSError, ValueError, KeyError, TypeError, ValidationError):
        return None


def refusal(in_force: Policy, where: str, given: Policy, given_path: Path) -> str:
    """Why a differing `--policy` is refused, with both fingerprints and every changed setting."""
    lines = [
        f"--policy {given_path} differs from the policy in force for this run ({where}):",
        f"  in force: {in_force.fingerprint()}",
        f"  given:    {given.fingerprint()}",
        *(f"  {d}" for d in differences(in_force, given)),
        "A different policy is a pivot. Restart without --policy to keep the run's policy, add "
        "--pivot to start a new phase at the newest checkpoint, or use `andreactl pivot --policy "
        f"{given_path}` while the trainer runs.",
    ]
    return "\n".join(lines)


def with_reward(policy: Policy, text: str, run_reward: Reward) -> tuple[Policy, str]:
    """A policy read from `text`, for a run whose reward is `run_reward`: unchanged if it names
    its reward; else with `run_reward`, and `text` with the key added (so that the run's policy
    file says it, see the module docstring)."""
    if policy.names_reward:
        return policy, text
    if run_reward in TARGETED_REWARDS:
        # The run's phase had a target and this policy has none: the reward of new runs.
        run_reward = NEW_RUN_REWARD
    named = Policy.model_validate({**policy.model_dump(mode="json"), "reward": run_reward})
    # Top-level keys must come before the first table: the line goes first.
    line = f'reward = "{run_reward}"  # the run\'s reward; this policy did not name one\n'
    return named, line + text


def _read(path: Path, run_reward: Reward) -> tuple[Policy, str, bool]:
    """A policy file for a run whose reward is `run_reward`: (policy, text naming the reward,
    whether the file named it)."""
    text = read_policy_text(path)  # read once: the text checked is the text stored
    raw = parse_policy(text, str(path))
    policy, text = with_reward(raw, text, run_reward)
    return policy, text, raw.names_reward


def resolve_policy(run_dir: Path, given: Path | None, pivot: bool) -> Resolved:
    """Decide the policy of this start (see the module docstring). Reads only; raises
    `PolicyError` for an unusable file or a refused change."""
    if pivot and given is None:
        raise PolicyError("--pivot needs --policy FILE (the policy of the new phase)")
    from_state = _state_policy(run_dir)
    if from_state is not None:
        run_reward = from_state.reward
    elif (run_dir / LOSS_FILE).exists():
        run_reward = IMPLICIT_REWARD  # steps logged before this proxy kept any state
    else:
        run_reward = NEW_RUN_REWARD
    stored_path = run_dir / POLICY_FILE
    stored = rewrite = None
    if stored_path.exists():
        stored, text, named = _read(stored_path, run_reward)
        rewrite = None if named else text
        run_reward = stored.reward
    if stored is not None and given is not None and given.resolve() == stored_path.resolve():
        return Resolved(stored, rewrite, False)
    reference, where = stored, str(stored_path)
    if reference is None:
        reference, where = from_state, f"{run_dir / STATE_FILE}"
    if given is not None:
        new, text, _ = _read(given, run_reward)
        if reference is None or reference.fingerprint() == new.fingerprint():
            return Resolved(new, text if stored is None else rewrite, False)
        if not pivot:
            raise PolicyError(refusal(reference, where, new, given))
        return Resolved(new, text, True)
    if stored is not None:
        return Resolved(stored, rewrite, False)
    policy = reference if reference is not None else Policy(reward=run_reward)
    return Resolved(policy, to_toml(policy), False)


def to_toml(policy: Policy) -> str:
    """`policy` as the text of a run's policy file (what the proxy writes when it makes one)."""
    import tomli_w

    return (
        "# The mixing policy in force for this run (written by andrea-proxy). Editing it while the\n"
        "# proxy is stopped is a pivot at the newest checkpoint; see docs/operations.md.\n"
        + tomli_w.dumps(policy.model_dump(mode="json"))
    )


def store(run_dir: Path, text: str) -> None:
    """Make `text` the run's policy file (atomically, durably)."""
    atomic_write_bytes(run_dir / POLICY_FILE, text.encode("utf-8"))
