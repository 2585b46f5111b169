"""alembic migrations of the rolltap store (script location for `rolltap db upgrade`)."""
