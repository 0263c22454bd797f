"""Running: one reconcile from claim to record (``runner``), how a worker shares itself among
keys (``pool``), run deadlines (``deadlines``), history rows (``history``), kept inputs and
their replay (``inputs``, ``replay``), capability evidence (``evidence``), durable timers
(``timers``), the Celery tasks that drive all of it (``tasks``), and the worker's health: its
probes, the check that pings it and the watch that ends it when stalled (``health``,
``stall``)."""
