"""kiln's benchmark suite: kiln against the torch peers, side by side in one run (`python -m benchmarks.suite`)."""
