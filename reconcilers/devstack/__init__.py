"""The local stack for development, tests and the demo: real services on 127.0.0.1.

etcd + kube-apiserver + kube-controller-manager (built from the Go module proxy by
``hack/build-control-plane.sh``), PostgreSQL and Redis (Debian's packages). Every start is
idempotent: a service that already answers is left alone. Standard library only, so it runs
before the virtualenv exists.

State lives in ``.local/`` of the checkout (or ``OPERATOR_STATE_DIR``): data directories, pid
files, logs, certificates, the kubeconfig and ``.local/env`` with the connection URLs.
"""
