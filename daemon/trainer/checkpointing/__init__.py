"""The trainer's side of checkpoints: when and what it saves (checkpointer, snapshot), and how a
resume restores one and cross-checks its manifest (restore, crosscheck)."""
