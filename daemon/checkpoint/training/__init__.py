"""The trainer's side of checkpoints: when and what it saves (checkpointer, snapshot), and how a
resume restores one and cross-checks its manifest (restore, crosscheck). The one part of
daemon/checkpoint/ that imports the trainer (its context, record sink, platform); the loop orders
it (pyproject.toml's import contracts place it among the trainer's layers)."""
