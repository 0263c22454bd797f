"""A reconciler that owns Deployments, cached whole or through a selector, for
``hack/watcher-memory.py`` (``MEMORY_SELECTOR``: the label selector of its ``Owns``)."""
