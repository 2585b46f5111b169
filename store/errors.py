"""What the store raises.

StoreError
 ├── BadDatabaseURL        the URL names no database rolltap can use, or is malformed
 ├── DatabaseUnavailable   the database could not be reached or opened
 ├── InvalidTokens         token ids or logprobs that must not be stored (also a ValueError)
 ├── NotFound              no rollout or call with that id
 ├── AmbiguousId           an id prefix that begins several ids
 ├── ReadOnly              a write to a store opened read-only
 └── WriterClosed          a record was submitted after the writer stopped
"""

from __future__ import annotations


class StoreError(Exception):
    pass


class BadDatabaseURL(StoreError):
    pass


class DatabaseUnavailable(StoreError):
    pass


class InvalidTokens(StoreError, ValueError):
    pass


class NotFound(StoreError, LookupError):
    pass


class AmbiguousId(StoreError, LookupError):
    pass


class ReadOnly(StoreError):
    pass


class WriterClosed(StoreError):
    pass
