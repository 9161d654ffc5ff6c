"""One module per CLI command; each exposes ``run(...) -> int`` and does no option parsing."""
