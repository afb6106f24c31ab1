"""Checkpoints: the payload format, its writer, the manifest, RNG states, durable writes, and the
manager that saves, discovers and verifies them."""
