"""The door to Kubernetes and the cache: the one client (``kube``), the shared object cache in
Redis (``cache``), the leader-term fence on its writes (``fence``), the journal of changes not
yet in the work queue (``journal``), Events (``events``) and what a reconcile reads and writes
through (``context``): its reads (``lister``) and its writes of children (``children``). Only
``kube`` imports the official client."""
