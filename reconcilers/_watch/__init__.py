"""Watching: list and watch into the cache (``reflector``), events to keys (``handlers``), keys
into the work queue (``enqueuer``), the streams wired from the reconcilers (``streams``), the
watcher's lifecycle and supervisor (``lifecycle``), leader election (``leader``), the scopes
deployments announce (``scopes``), the new leader's start pass (``onstart``), and the watcher's
health: what its probes report, its heartbeat and the check of it (``health``)."""
