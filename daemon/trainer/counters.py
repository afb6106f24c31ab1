"""Where one life of the trainer stands: the counters that status, metrics, progress lines and
manifests read, in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from andrea.protocol.lineage import Lineage
from andrea.protocol.status import Activity


@dataclass
class Counters:
    """Written by the training thread (the checkpoint fields also by the writer thread, when a
    background write commits); read as plain values by the control thread (status)."""

    step: int = 0
    tokens_seen: int = 0
    #: Time spent in training steps over the whole run (the manifest carries it across lives).
    train_seconds: float = 0.0
    loss_ema: float | None = None
    #: The segment this life trains (a new one after a pivot's roll-back); with the proxy, 0
    #: until the proxy has numbered it.
    segment: int = 0
    phase: int = 0
    activity: Activity = Activity.STARTING
    # As of the last progress line (status, metrics); None until the first.
    tokens_per_second: float | None = None
    seconds_per_step: float | None = None
    lr: float | None = None
    #: The newest step with a committed checkpoint (0: none yet).
    last_saved: int = 0
    #: Unix time the newest checkpoint was committed.
    last_saved_at: float | None = None
    checkpoints_written: int = 0
    #: The newest step whose held-out evaluation is recorded (a manifest field).
    last_eval_step: int = 0
    #: Held-out loss per arm of the weights after update `last_eval_step` (None when this life does
    #: not know it): the loss record of the step after it carries them to the bandit.
    heldout: dict[str, float] | None = None
    #: Where the run's state came from (world sizes, --init-from); set at the start of a life.
    lineage: Lineage | None = None
    #: With --init-from: the source checkpoint's manifest, carried into every manifest.
    source_manifest: dict[str, Any] | None = None
