"""Benchmark commands: each runs cpkv and its baseline side by side in one process."""
