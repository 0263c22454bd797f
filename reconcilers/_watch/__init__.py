"""Watching: list and watch into the cache (``reflector``), events to keys (``handlers``), the
watcher's streams, enqueuer and lifecycle (``watcher``), leader election (``leader``), the
scopes deployments announce (``scopes``), the new leader's start pass (``onstart``), and the
health the probes report (``health``)."""
