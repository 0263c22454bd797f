"""The operator framework as a Django app: registry, watch, ledger, tasks, runner, history, admin.

Reconciler authors import from ``reconcilers.api`` only.
"""
