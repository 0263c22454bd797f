"""Admin page load times over a large history (default 1,000,000 reconcile records).

    .venv/bin/python hack/bench-admin.py [--rows 1000000] [--repeat 5]

Uses its own database (``<name>_adminbench`` beside DATABASE_URL's), fills it with
``generate_series`` in one statement, then times each admin page through Django's test client
(the whole request: middleware, queries, template rendering) and prints a markdown table of
median / max milliseconds and the number of SQL queries per page.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from reconcilers._base.environ import load_env_file, parse_database_url

    load_env_file(REPO / ".local" / "env")
    db = parse_database_url(os.environ["DATABASE_URL"])
    bench_db = f"{db['NAME']}_adminbench"
    import psycopg

    with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"],
                         password=db["PASSWORD"], dbname="postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{bench_db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{bench_db}"')
    os.environ["DATABASE_URL"] = os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/" + bench_db

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    settings.ALLOWED_HOSTS = ["testserver"]
    call_command("migrate", verbosity=0)
    from django.contrib.auth.models import User

    from reconcilers.models import ReconcileRecord, RegisteredReconciler, WorkItem
    from reconcilers._authoring.registry import registry

    t0 = time.perf_counter()
    table = ReconcileRecord._meta.db_table
    with connection.cursor() as cursor:
        # 1,000 objects x 1,000 runs each over the last 14 days; 5 % errors.
        cursor.execute(f"""
            INSERT INTO {table} (reconciler, namespace, name, uid, triggers, attempt,
                started_at, finished_at, duration_ms, outcome, error_class, error_message,
                traceback, resource_version, generation, worker, task_id, audit_ids, events,
                conditions, observed_generation, phase)
            SELECT 'probes.test.operator.local', 'ns-' || (i %% 20), 'obj-' || (i %% 1000),
                   md5((i %% 1000)::text), ARRAY['modified'], 1,
                   now() - (i * interval '1 second') * (1209600.0 / %s),
                   now() - (i * interval '1 second') * (1209600.0 / %s) + interval '5 ms',
                   5, CASE WHEN i %% 20 = 0 THEN 'error' ELSE 'success' END,
                   CASE WHEN i %% 20 = 0 THEN 'builtins.RuntimeError' ELSE '' END,
                   CASE WHEN i %% 20 = 0 THEN 'boom' ELSE '' END, '', i::text, 1, 'bench:1',
                   '', '{{}}', '[]', '[]', 1, 'reconcile'
            FROM generate_series(1, %s) AS i""", [args.rows, args.rows, args.rows])
        cursor.execute(f"ANALYZE {table}")
    fill = time.perf_counter() - t0
    RegisteredReconciler.sync_from(list(registry))
    WorkItem.objects.bulk_create([WorkItem(reconciler="probes.test.operator.local",
                                           namespace=f"ns-{i % 20}", name=f"obj-{i}")
                                  for i in range(1000)])
    user = User.objects.create_superuser("bench", password="bench")
    client = Client()
    client.force_login(user)

    pages = {
        "history (unfiltered)": "/admin/reconcilers/reconcilerecord/",
        "history, outcome=error": "/admin/reconcilers/reconcilerecord/?outcome__exact=error",
        "history, trigger=modified": "/admin/reconcilers/reconcilerecord/?trigger=modified",
        "history, reconciler": "/admin/reconcilers/reconcilerecord/"
                               "?reconciler=probes.test.operator.local",
        "history, search name": "/admin/reconcilers/reconcilerecord/?q=obj-7",
        "history, page 100": "/admin/reconcilers/reconcilerecord/?p=100",
        "history, one day": "/admin/reconcilers/reconcilerecord/?started_at__day="
                            f"{time.gmtime().tm_mday}&started_at__month={time.gmtime().tm_mon}"
                            f"&started_at__year={time.gmtime().tm_year}",
        "history detail": f"/admin/reconcilers/reconcilerecord/"
                          f"{ReconcileRecord.objects.order_by('-id').values_list('id', flat=True)[0]}/change/",
        "timeline (one object)": "/admin/reconcilers/workitem/timeline/"
                                 "?reconciler=probes.test.operator.local&namespace=ns-7&name=obj-7",
        "work items": "/admin/reconcilers/workitem/",
        "reconcilers": "/admin/reconcilers/registeredreconciler/",
        "dashboard": "/admin/reconcilers/registeredreconciler/dashboard/",
    }
    print(f"\n{args.rows:,} history rows inserted in {fill:.1f} s\n")
    print("| page | median ms | max ms | SQL queries |")
    print("| --- | ---: | ---: | ---: |")
    for label, url in pages.items():
        times = []
        for _ in range(args.repeat):
            with CaptureQueriesContext(connection) as q:
                t = time.perf_counter()
                resp = client.get(url)
                times.append((time.perf_counter() - t) * 1000)
            assert resp.status_code == 200, (url, resp.status_code)
        print(f"| {label} | {statistics.median(times):.0f} | {max(times):.0f} | "
              f"{len(q.captured_queries)} |")


if __name__ == "__main__":
    main()
