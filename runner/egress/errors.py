"""Egress errors: `EgressError > EgressUnavailable | BadEgressSetting`."""

from __future__ import annotations


class EgressError(Exception):
    pass


class EgressUnavailable(EgressError):
    """The gate cannot run here (mitmproxy is not installed, or it did not start)."""


class BadEgressSetting(EgressError, ValueError):
    """A pattern that can match nothing, an unknown mode, an unreadable config file."""
