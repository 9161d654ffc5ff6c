"""Renderers: terminal summary, JSON and the HTML diagnosis (one module per output)."""
