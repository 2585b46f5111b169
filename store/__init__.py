"""The SQL store of rollouts, calls and their exact token ids (SQLite or PostgreSQL)."""

from rolltap.store.errors import (
    BadDatabaseURL,
    DatabaseUnavailable,
    InvalidTokens,
    NotFound,
    StoreError,
    WriterClosed,
)
from rolltap.store.models import CallDialect, CallStatus, Capture, RolloutStatus
from rolltap.store.reader import StoreReader, open
from rolltap.store.records import (
    CallBodies,
    CallReceipt,
    CallRecord,
    CallTokens,
    CallView,
    ChoiceRecord,
    ChoiceTokens,
    CreatedRollout,
    NewRollout,
    RolloutView,
)
from rolltap.store.store import Store
from rolltap.store.url import DatabaseURL, resolve_url

__all__ = [
    "BadDatabaseURL",
    "CallBodies",
    "CallDialect",
    "CallReceipt",
    "CallRecord",
    "CallStatus",
    "CallTokens",
    "CallView",
    "Capture",
    "ChoiceRecord",
    "ChoiceTokens",
    "CreatedRollout",
    "DatabaseURL",
    "DatabaseUnavailable",
    "InvalidTokens",
    "NewRollout",
    "NotFound",
    "RolloutStatus",
    "RolloutView",
    "Store",
    "StoreError",
    "StoreReader",
    "WriterClosed",
    "open",
    "resolve_url",
]
