"""andrea-trainer's training loop and what it is built from (loop.py says which module does what)."""

from .loop import Trainer
from .options import TrainerOptions

__all__ = ["Trainer", "TrainerOptions"]
