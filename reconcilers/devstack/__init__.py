"""The local stack for development, tests and the demo: real services on 127.0.0.1.

etcd + kube-apiserver + kube-controller-manager (built from the Go module proxy by
``build-control-plane.sh`` beside this file), PostgreSQL and Redis (Debian's packages). Every
start is idempotent: a service that already answers is left alone. Standard library only, so it
runs before the virtualenv exists (``python3 -m reconcilers.devstack up`` from a checkout), and
it ships with the app, so a project that pip-installed it gets the same stack for its tests.

State lives in ``.local/`` of the checkout, or of the current directory outside one (or
``OPERATOR_STATE_DIR``): data directories, pid files, logs, certificates, the kubeconfig and
``.local/env`` with the connection URLs.
"""
