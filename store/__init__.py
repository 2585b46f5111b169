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
    from .egress import EgressRecord
    from .reader import StoreReader, open
    from .store import Store
    from .writer import StoreState, StoreStatus

# The facades (the async Store, the blocking reader) are loaded on first use: they need
# SQLAlchemy and numpy, and what is loaded here needs neither: `rolltap ls` reads SQLite without
# them. The store is persistence only: what reads a record (trajectories, hack checks, the
# chain's verification, replay reports) lives in analysis/ and audit/, on top of it.
_LAZY = {
    "EgressRecord": ".egress",
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
    "NewRollout",
    "NotFound",
    "ReadOnly",
    "RolloutAnalysis",
    "RolloutFilter",
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
