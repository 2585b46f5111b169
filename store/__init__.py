"""The SQL store of rollouts, calls and their exact token ids (SQLite or PostgreSQL)."""

from typing import TYPE_CHECKING

from ..lazy import lazy_names
from .enums import CallDialect, CallStatus, Capture, EgressVerdict, RolloutStatus, Verdict
from .errors import (
    AmbiguousId,
    BadDatabaseURL,
    DatabaseUnavailable,
    InvalidTokens,
    NotFound,
    ReadOnly,
    StoreError,
    WriterClosed,
)
from .filters import RolloutFilter
from .lifecycle import IllegalTransition
from .records import (
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
from .url import DatabaseURL, resolve_url

if TYPE_CHECKING:
    from ..audit.integrity import Issue, IssueKind, RefusedCall, RolloutIntegrity
    from .egress import EgressRecord
    from .reader import StoreReader, open
    from .store import Store
    from .writer import StoreState, StoreStatus

# The facades (the async Store, the blocking reader, the audit's integrity types) are loaded on
# first use: they build on the trajectory analysis and the audit, which themselves read
# store.models and store.records, so loading them here would make `import rolltap.store.models`
# (from analysis/, audit/ or a CLI command that only lists rows) pull in everything. What is
# loaded here needs neither SQLAlchemy nor numpy: `rolltap ls` reads SQLite without them.
_LAZY = {
    "EgressRecord": ".egress",
    "Issue": "..audit.integrity",
    "IssueKind": "..audit.integrity",
    "RefusedCall": "..audit.integrity",
    "RolloutIntegrity": "..audit.integrity",
    "StoreReader": ".reader",
    "open": ".reader",
    "Store": ".store",
    "StoreState": ".writer",
    "StoreStatus": ".writer",
}


__getattr__ = lazy_names(__name__, _LAZY)


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
    "RolloutFilter",
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
