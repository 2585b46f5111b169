"""The SQL store of rollouts, calls and their exact token ids (SQLite or PostgreSQL)."""

from rolltap.store.egress import EgressRecord
from rolltap.store.errors import (
    AmbiguousId,
    BadDatabaseURL,
    DatabaseUnavailable,
    InvalidTokens,
    NotFound,
    ReadOnly,
    StoreError,
    WriterClosed,
)
from rolltap.store.integrity import Issue, IssueKind, RefusedCall, RolloutIntegrity
from rolltap.store.lifecycle import IllegalTransition
from rolltap.store.models import (
    CallDialect,
    CallStatus,
    Capture,
    EgressVerdict,
    RolloutStatus,
    Verdict,
)
from rolltap.store.reader import StoreReader, open
from rolltap.store.records import (
    BatchView,
    CallBodies,
    CallReceipt,
    CallRecord,
    CallTokens,
    CallView,
    ChoiceRecord,
    ChoiceTokens,
    CreatedRollout,
    NewRollout,
    RolloutAnalysis,
    RolloutView,
)
from rolltap.store.store import Store
from rolltap.store.url import DatabaseURL, resolve_url
from rolltap.store.writer import StoreState, StoreStatus

__all__ = [
    "AmbiguousId",
    "BadDatabaseURL",
    "BatchView",
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
    "EgressRecord",
    "EgressVerdict",
    "IllegalTransition",
    "InvalidTokens",
    "Issue",
    "IssueKind",
    "NewRollout",
    "NotFound",
    "ReadOnly",
    "RefusedCall",
    "RolloutAnalysis",
    "RolloutIntegrity",
    "RolloutStatus",
    "RolloutView",
    "Store",
    "StoreError",
    "StoreReader",
    "StoreState",
    "StoreStatus",
    "Verdict",
    "WriterClosed",
    "open",
    "resolve_url",
]
