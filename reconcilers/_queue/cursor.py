"""How the ledger's modules talk to PostgreSQL: the work table, the one order rows are
locked in, and a cursor whose statements are prepared once per connection.

Only the ledger's modules (``ledger``, ``reaper``, ``upkeep``) use this one.
"""

from __future__ import annotations

from django.db import connection
from django.db.backends.postgresql.base import ServerBindingCursor

from reconcilers._base.conf import settings
from reconcilers.models import WorkItem

TABLE = WorkItem._meta.db_table

# Every statement that locks several rows locks them in this order, the key's: two statements
# that took the same rows in two orders (enqueue by key, the reaper by id) could each hold a
# row the other waits for, and PostgreSQL ends one of them with a deadlock error. Byte order
# ("C"), whatever the database's collation: Python's sorted() of keys agrees with it, for
# callers that lock in several statements of one transaction (``manual``).
LOCK_ORDER = 'reconciler COLLATE "C", namespace COLLATE "C", name COLLATE "C"'


class _PreparedCursor(ServerBindingCursor):
    """Server-side binding, each statement prepared on first use: the ledger's few statements
    run for every key, and planning them (CTEs, CASEs) costs PostgreSQL more than running
    them, while client-side binding escapes every value in Python."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        return super().execute(query, params, prepare=True, binary=binary)


_ONLY_WHEN_ASKED = 2**31 - 1  # a prepare threshold no other statement reaches


def open_cursor():
    """A cursor for the ledger's statements (``RECONCILERS_PREPARED_STATEMENTS``), wrapped as
    Django wraps its own, so query capture, execute wrappers and error translation apply."""
    if not settings().prepared_statements:
        return connection.cursor()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:  # Django's default turns preparing off altogether;
        raw.prepare_threshold = _ONLY_WHEN_ASKED  # now only the ledger's are prepared
    with connection.wrap_database_errors:
        return connection._prepare_cursor(_PreparedCursor(raw))


def fetch_all(cursor) -> list[tuple]:
    """Every row a statement returned; none for one that returns no rows."""
    return cursor.fetchall() if cursor.description else []
