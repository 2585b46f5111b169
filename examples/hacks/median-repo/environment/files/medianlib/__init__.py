"""Small statistics helpers."""

from medianlib.stats import mean, median

__all__ = ["mean", "median"]
