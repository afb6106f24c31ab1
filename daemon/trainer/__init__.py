"""andrea-trainer's training loop and what it is built from (loop.py says which module does what)."""

from .factory import Opened, assemble, build_trainer, open_context
from .loop import Trainer
from .options import TrainerOptions

__all__ = ["Opened", "Trainer", "TrainerOptions", "assemble", "build_trainer", "open_context"]
