"""Models: the GR transformer with its KV-cache API, prompt building and checkpoints."""
