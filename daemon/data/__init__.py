"""A run's data: arms, sources, encoding, the token cache, the tokenizer, the held-out split."""
