"""rolltap: token-faithful RL rollouts from unmodified agent harnesses."""

__version__ = "0.1.0"
