"""Plan files: the header and manifest format, serialization of the network, signing, device compatibility and
re-tuning on load. The `Engine` that reads and runs them lives in kiln.runtime (the layer above)."""
