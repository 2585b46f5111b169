"""Checking a record: the hash chain verified, signed exports, replay reports."""
