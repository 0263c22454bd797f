"""The door to Kubernetes and the cache: the one client (``kube``), the shared object cache in
Redis (``cache``), Events (``events``) and what a reconcile reads and writes through
(``context``). Only ``kube`` imports the official client."""
