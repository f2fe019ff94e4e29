"""kiln's version, recorded in every plan and timing cache."""

__version__ = "0.1.0"
