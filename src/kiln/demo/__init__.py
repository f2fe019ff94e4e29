"""Demo models kiln makes itself (plain torch, nothing downloaded): exported, built, checked and timed."""

from kiln.demo.runner import DEMOS, DemoResult, cache_dir, run_demo

__all__ = ["DEMOS", "DemoResult", "cache_dir", "run_demo"]
