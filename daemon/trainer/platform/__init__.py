"""What the trainer runs on: process group, determinism, precision, CUDA environment."""
