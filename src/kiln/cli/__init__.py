"""The `kiln` command line: build, run, inspect, bench, demo and conformance."""
