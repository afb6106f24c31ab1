"""A synthetic loss landscape and a driver for the bandit, shared by the bandit's and the reward's tests."""

from __future__ import annotations

import json
import math

from andrea.daemon.mixing.bandit import (
    Bandit,
)
from andrea.daemon.mixing.policy import Policy


def synthetic_loss(step: int, arm: str) -> float:
    """A deterministic, arm-dependent loss curve (the 'trainer')."""
    base = {"a": 3.0, "b": 2.0, "c": 1.0, "d": 2.5}.get(arm, 1.5)
    return base / (1.0 + step / 200.0) + 0.1 * math.sin(step * 0.7 + len(arm))


def drive(bandit: Bandit, first: int, last: int, assigned: dict[int, str]) -> dict[int, str]:
    """What the proxy does: incorporate every loss up to s - W in order, then assign s."""
    lag = bandit.policy.lag
    for s in range(first, last + 1):
        while bandit.last_step < s - lag:
            j = bandit.last_step + 1
            bandit.observe(j, assigned[j], synthetic_loss(j, assigned[j]))
        assigned[s] = bandit.assign(s, [assigned[j] for j in range(bandit.last_step + 1, s)])
    return assigned


def seed_state() -> str:
    """The seed's .state.json at step 112,619: repo-docstrings carries weight 1.546 from an earlier run."""
    policy = Policy(arms={"repo-docstrings": {"floor": 0.5}, "code": {"floor": 0.3}})
    return json.dumps(
        {
            "version": 1,
            "seed": 1337,
            "phase": 1,
            "phase_start_step": 112000,
            "last_step": 112619,
            "steps_in_phase": 619,
            "policy": policy.model_dump(mode="json"),
            "policy_fingerprint": policy.fingerprint(),
            "arms": [
                {
                    "name": "code",
                    "identity": "id-code",
                    "live": True,
                    "zombie_reason": None,
                    "pulls": 400,
                    "ema_reward": 40.0,
                    "weight": 0.4,
                    "probability": 0.5,
                },
                {
                    "name": "comments",
                    "identity": "id-comments",
                    "live": True,
                    "zombie_reason": None,
                    "pulls": 119,
                    "ema_reward": 30.0,
                    "weight": 0.3,
                    "probability": 0.3,
                },
                {
                    "name": "repo-docstrings",
                    "identity": "id-repo",
                    "live": True,
                    "zombie_reason": None,
                    "pulls": 100,
                    "ema_reward": 55.0,
                    "weight": 1.546,
                    "probability": 0.2,
                },
            ],
            "last_observation": {"step": 112619, "arm": "code", "loss": 3.7},
        }
    )
