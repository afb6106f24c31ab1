"""Metrics of a run for the tools people already use: derived series, TensorBoard, CSV/JSONL, Prometheus."""
