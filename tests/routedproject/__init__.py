"""A user's project that routes the reconcile tasks to a queue of its own and counts every
message Celery publishes for them (``tests/e2e/test_celery_routing.py``)."""
