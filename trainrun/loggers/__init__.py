"""Callbacks that record a run: time-to-accuracy JSONL and summary, and the console."""
