"""Benchmarks: this project side by side with kopf, controller-runtime and the api-server ceiling.

``python -m bench --quick`` (``make bench-quick``) or ``python -m bench`` (``make bench``); see
``docs/contributing/benchmarks.md`` for what is measured, how, and the latest figures. Layout:

- ``harness``      runs the plan: each scenario, each implementation in turn, repetitions
                   alternating the order
- ``results``      one file per scenario of every run, never overwritten, with the version,
                   commit, arguments and environment overrides: ``bench/results/``
- ``figures``      the headline: medians over every full run of one version, from all results
                   files, into docs/contributing/benchmarks.md
- ``impls/``       one module per implementation: how to start, stop and describe it
- ``scenarios/``   one module per scenario: drive the workload, check, measure
- ``workload``     the BenchItem CRD, namespaces, creates/updates, the correctness check
- ``observe``      a separate watch process that timestamps convergence
- ``probes``       CPU/RSS/PSS of process groups (the operator's, its whole footprint's) and
                   the api-server's request counters
- ``report``       one run's medians, ratios and markdown tables in docs/contributing/benchmarks.md
- ``profile``      py-spy on this project's processes during a converge (what dominates)
- ``kube``         the harness's own small api-server client; ``config`` where things are
- ``peers/``       the kopf operator and the Go module (controller-runtime operator, apiload)
- ``benchapp/``, ``settings``  this project's BenchItem reconciler and its settings module
"""
