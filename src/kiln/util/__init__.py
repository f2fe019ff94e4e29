"""Small helpers every layer may use (above errors and version only)."""
