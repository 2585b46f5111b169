"""Replaying a recorded rollout: its calls answered from the record (`rolltap replay`)."""

from .cassette import Cassette, Live
from .normalize import VERSION, Normalizer

__all__ = ["VERSION", "Cassette", "Live", "Normalizer"]
