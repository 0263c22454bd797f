"""Watching: list and watch into the cache (``reflector``, with what a stream last saw in
``known``, its index sets filed by ``indexer`` and its lists paged by ``pager``), events to
keys (``handlers``), keys into the work queue (``enqueuer``), the streams wired from the
reconcilers (``streams``), the watcher's lifecycle and supervisor (``lifecycle``), leader
election (``leader``), the scopes deployments announce (``scopes``), the new leader's start
pass (``onstart``), and the watcher's health: what its probes report, its heartbeat and the
check of it (``health``)."""
