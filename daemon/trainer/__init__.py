"""andrea-trainer's training loop and what it is built from (see loop.py for the loop itself)."""

from .loop import Trainer, TrainerOptions

__all__ = ["Trainer", "TrainerOptions"]
