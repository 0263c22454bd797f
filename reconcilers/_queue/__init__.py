"""The work queue: the ledger in PostgreSQL (``ledger``) and its one driver (``workqueue``),
the decision after a run (``decision``), the messages sent through Celery (``broker``), the
shared rate limit (``ratelimit``), manual actions (``manual``), resyncs (``resync``), the
periodic tasks' schedule (``periodic``) and the system checks of this setup (``checks``)."""
