"""Checkpoints, in one home: the payload format, its writer, the manifest, RNG states, durable
writes, and the manager that saves, discovers and verifies them; and in training/, the trainer's
side: when and what it saves, and how a resume restores one. The tools read run directories with
the format and the manager, which never import the trainer."""
