"""The names the multiproject's reconcilers and their tests share, kept apart from the
reconcilers so a test can name them without registering the reconcilers in its own process
(every other test's registry would then hold them)."""

FAIL = "multiproject/fail"
FINALIZED = "multiproject:finalized"  # Redis list: <namespace>/<name> of each cleanup done
MAY_FINISH = "multiproject:may-finish:"
