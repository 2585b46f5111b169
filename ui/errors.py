"""What the viewer's pages raise; app.py turns each into an HTML error page.

NotFound (rolltap.store)   404: no such rollout or call
BadQuery                   400: a filter or page parameter that makes no sense
DatabaseUnavailable, DBAPIError (the store)   503: the store cannot be read right now
"""

from __future__ import annotations


class BadQuery(ValueError):
    pass
