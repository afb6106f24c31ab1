"""The arm kinds: one module a kind (stdlib, text, jsonl, parquet, tokens), each registering an
`ArmKind` with the registry (daemon/data/kinds/registry.py), which the config, the data, the
trainer's `--check` and the tools read every kind check from."""
