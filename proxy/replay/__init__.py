"""Replaying a recorded rollout: its calls answered from the record (`rolltap replay`)."""

from rolltap.proxy.replay.cassette import Cassette, Live
from rolltap.proxy.replay.normalize import VERSION, Normalizer

__all__ = ["VERSION", "Cassette", "Live", "Normalizer"]
