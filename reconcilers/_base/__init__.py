"""The shared words and settings at the bottom: keys and triggers (``vocab``), the operator's
settings (``conf``, ``environ``), what a reconcile returns (``results``), event filters
(``predicates``), run-tagged logs (``logs``), process-wide singletons (``once``), metrics and the
small HTTP endpoint every process serves with the checks every role shares (``metrics``,
``probes``), the processes running in this container (``processes``), and the capability
levels' criteria (``capability_levels``). Nothing here imports another wing."""
