"""andreactl export: a checkpoint as a self-contained bundle, or in the Hugging Face layout."""
