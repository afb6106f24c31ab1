"""Synthetic loss landscapes and drivers for the bandit, shared by the bandit's and the rewards'
tests."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np

from andrea.daemon.mixing import rewards
from andrea.daemon.mixing.bandit import Bandit, ConfiguredArm
from andrea.daemon.mixing.policy import Policy

#: The three stdlib arms, as `Learner` kinds.
TEXT3 = {"code": "text", "comments": "text", "docstrings": "text"}


def synthetic_loss(step: int, arm: str) -> float:
    """A deterministic, arm-dependent loss curve (the 'trainer')."""
    base = {"a": 3.0, "b": 2.0, "c": 1.0, "d": 2.5}.get(arm, 1.5)
    return base / (1.0 + step / 200.0) + 0.1 * math.sin(step * 0.7 + len(arm))


def targeted(reward: str, *arms: str) -> dict[str, list[str]]:
    """The policy keys a reward needs besides its name: a target (of `arms`) for the transfer
    reward, nothing for the others."""
    return {"target": list(arms)} if rewards.lookup(reward).targeted else {}


def synthetic_probe(step: int, arms: list[str], assigned: dict[int, str]) -> dict[str, float]:
    """A deterministic probe of `arms` after `step`: each falls 0.004 per step of "a" trained,
    0.001 per step of "b", and rises 0.002 per step of any other arm, plus a wobble."""
    effect = {"a": -0.004, "b": -0.001}
    drift = sum(effect.get(assigned[s], 0.002) for s in range(1, step + 1) if s in assigned)
    return {n: 3.0 + drift + 0.003 * math.sin(step * 1.3 + len(n)) for n in arms}


def drive(bandit: Bandit, first: int, last: int, assigned: dict[int, str]) -> dict[int, str]:
    """What the proxy does: incorporate every loss up to s - W in order, then assign s (with the
    probe each record carries when the bandit asks for one)."""
    lag = bandit.policy.lag
    for s in range(first, last + 1):
        while bandit.last_step < s - lag:
            j = bandit.last_step + 1
            asked = bandit.probe_arms(j)
            probe = synthetic_probe(j, asked, assigned) if asked else None
            bandit.observe(j, assigned[j], synthetic_loss(j, assigned[j]), None, probe)
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


class Learner:
    """Losses shaped like andrea-tiny's on its arms (tests/bench/bench_mixing.py measures the
    real thing): each arm's loss is a function of what has been trained so far, plus noise."""

    def __init__(self, kinds: dict[str, str], seed: int = 0) -> None:
        self.kinds = kinds
        self.rng = np.random.default_rng(seed)
        self.pulls = dict.fromkeys(kinds, 0)
        self.last = dict.fromkeys(kinds, 0)
        self.t = 0

    def loss(self, arm: str) -> float:
        """The loss of training `arm` at the next step (then it counts as trained)."""
        kind, n, t = self.kinds[arm], self.pulls[arm], self.t
        if kind == "text":  # learns from its own steps, and a little from the others'
            value = 1.6 + 3.9 / math.sqrt(1 + (n + 0.3 * (t - n)) / 8) + self.rng.normal(0, 0.12)
        elif kind == "random":  # 5.55 nats at best; worse while the model trains on text
            idle = t - self.last[arm] if n else t
            value = 5.55 + 0.6 * (1 - math.exp(-idle / 60)) + self.rng.normal(0, 0.013)
        elif kind == "floor":  # letters drawn independently: their odds learnt in ~30 steps
            value = 1.21 + 4.34 * math.exp(-n / 5) + self.rng.normal(0, 0.02)
        else:  # one short document repeated: learnt to its floor in a few hundred steps
            value = 0.15 + 5.4 * math.exp(-n / 40) + abs(self.rng.normal(0, 0.04))
        self.t += 1
        self.pulls[arm] += 1
        self.last[arm] = self.t
        return value

    def heldout(self, arm: str) -> float:
        """The arm's held-out loss now: its expected loss, without noise, and higher the longer it
        has not been trained (as andrea-tiny forgets an arm it stops training)."""
        kind, n, t = self.kinds[arm], self.pulls[arm], self.t
        forgotten = 1 - math.exp(-(t - self.last[arm] if n else t) / 60)
        if kind == "text":
            return 1.6 + 3.9 / math.sqrt(1 + (n + 0.3 * (t - n)) / 8) + 0.3 * forgotten
        if kind == "random":
            return 5.55 + 0.6 * forgotten
        if kind == "floor":
            return 1.21 + 4.34 * math.exp(-n / 5) + 0.05 * forgotten
        return 0.15 + 5.4 * math.exp(-n / 40) + 0.5 * forgotten


def run(
    kinds: dict[str, str], policy: Policy, steps: int, seed: int = 5, eval_every: int = 0
) -> list[str]:
    """What the proxy does, with the loss of each step coming from a `Learner`, and every
    `eval_every` steps (0: never) its held-out losses carried by the next step's record, as the
    trainer sends them."""
    arms = [ConfiguredArm(n, n, True) for n in kinds]
    b = Bandit(arms, policy, seed=seed)
    learner = Learner(kinds, seed)
    losses: dict[int, tuple[str, float]] = {}
    heldout: dict[int, dict[str, float]] = {}
    trained = []
    for s in range(1, steps + 1):
        while b.last_step < s - policy.lag:
            j = b.last_step + 1
            b.observe(j, *losses[j], heldout.get(j))
        arm = b.assign(s, [losses[j][0] for j in range(b.last_step + 1, s)])
        losses[s] = (arm, learner.loss(arm))
        trained.append(arm)
        if eval_every and s % eval_every == 0:
            heldout[s + 1] = {n: learner.heldout(n) for n in kinds}
    return trained


def second_half_share(trained: Sequence[str], arm: str) -> float:
    half = trained[len(trained) // 2 :]
    return half.count(arm) / len(half)
