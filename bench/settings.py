"""Settings for this project's processes under the benchmark (``DJANGO_SETTINGS_MODULE=bench.settings``).

The project's settings plus the bench-only ``BenchItem`` app, minus the bundled sample
operator (so the watcher streams nothing but BenchItems). Database and Redis come from the
environment the harness sets: a database and a Redis db number of its own, never dev or test data.
"""

from operator_project.settings import *  # noqa: F401,F403
from operator_project.settings import INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "reconcilers.contrib.samplecontroller"]
INSTALLED_APPS.append("bench.benchapp")
OPERATOR_SAMPLES = False

# Experiment knobs, off by default so the benchmark measures the project as configured. Each
# one exists to measure a proposed change (bench/results/history.md); the harness
# passes every BENCH_EXPERIMENT_* variable of its environment to this project's processes:
#   BENCH_EXPERIMENT_DB_REUSE_MAX=0      close database connections around every Celery task
#                                        (the behaviour before CELERY_DB_REUSE_MAX was set)
#   BENCH_EXPERIMENT_METRICS_OFF=1       no Prometheus metrics (OPERATOR_METRICS=0): the
#                                        baseline of the metrics' overhead
#   BENCH_EXPERIMENT_UNPREPARED=1        RECONCILERS_PREPARED_STATEMENTS off
#   BENCH_EXPERIMENT_RECONCILERS_X=v     any operator setting: RECONCILERS_X=v
import os as _os  # noqa: E402

if _os.environ.get("BENCH_EXPERIMENT_DB_REUSE_MAX"):
    # Celery's Django fixup closes every database connection before and after each task
    # unless CELERY_DB_REUSE_MAX is set (0 = unset): each reconcile opens a new connection.
    CELERY_DB_REUSE_MAX = int(_os.environ["BENCH_EXPERIMENT_DB_REUSE_MAX"])

if _os.environ.get("BENCH_EXPERIMENT_METRICS_OFF"):
    # Read from the environment as the operator first counts anything, after this module.
    _os.environ["OPERATOR_METRICS"] = "0"

if _os.environ.get("BENCH_EXPERIMENT_UNPREPARED"):
    # The ledger's statements bound client-side and planned on every execution (the
    # behaviour before RECONCILERS_PREPARED_STATEMENTS).
    RECONCILERS_PREPARED_STATEMENTS = False
