"""Reference implementations of kinds of no other family: none so far (ImageDecoder is rejected at import)."""
