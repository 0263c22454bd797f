"""A person in a real browser: Debian's Chromium driven by Playwright, against the admin served
by a real web process, with the sample operator running (watcher, worker, beat).

Screenshots of the dashboard and the history list are saved in test-artifacts/screenshots/.
"""

from __future__ import annotations

import os
import re
import socket
import sys

import pytest
from kubernetes import client

from tests.fixtures import ARTIFACTS
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FOO = "foos.samplecontroller.k8s.io"
CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium's own connections are refused by this
# machine's closed network; never `playwright install`, which downloads a browser.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _foo(name: str, deployment: str) -> dict:
    return {"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
            "metadata": {"name": name}, "spec": {"deploymentName": deployment, "replicas": 1}}


@pytest.fixture
def web(start_process):
    port = _free_port()
    proc = start_process("web", [sys.executable, "manage.py", "runserver",
                                 f"127.0.0.1:{port}", "--noreload"])
    proc.wait_for_log("Quit the server", timeout=60)
    return f"http://127.0.0.1:{port}"


def test_staff_find_an_error_open_the_run_resync_a_foo_and_see_the_new_run(
        kube, namespace, operator, web):
    from django.contrib.auth.models import User
    from playwright.sync_api import expect, sync_playwright

    assert os.path.exists(CHROMIUM), "Debian's chromium is missing: run hack/ensure-test-tools.sh"
    User.objects.create_superuser("staff", password="correct horse battery")
    operator.start_watcher(FOO)
    operator.start_worker()
    operator.start_beat(operator.schedule)
    foos = client.CustomObjectsApi(kube)
    client.CoreV1Api(kube).create_namespaced_config_map(namespace, {"metadata": {"name": "x"}})
    client.AppsV1Api(kube).create_namespaced_deployment(namespace, {
        "metadata": {"name": "taken"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
    foos.create_namespaced_custom_object("samplecontroller.k8s.io", "v1alpha1", namespace,
                                         "foos", _foo("browser-foo", "browser-foo"))
    foos.create_namespaced_custom_object("samplecontroller.k8s.io", "v1alpha1", namespace,
                                         "foos", _foo("squatter", "taken"))
    from reconcilers.models import ReconcileRecord

    wait_for(lambda: ReconcileRecord.objects.filter(name="browser-foo", outcome="success")
             .exists() and ReconcileRecord.objects.filter(name="squatter", outcome="error")
             .exists(), 60, "a success and an error in history")

    shots = ARTIFACTS / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # ORM reads below run beside Playwright's loop
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(f"{web}/admin/login/?next=/admin/")
            page.fill("#id_username", "staff")
            page.fill("#id_password", "correct horse battery")
            page.click("input[type=submit]")
            expect(page.get_by_role("link", name="Dashboard")).to_be_visible()

            page.get_by_role("link", name="Reconcile records").click()
            expect(page.locator("#result_list")).to_contain_text("browser-foo")
            page.screenshot(path=str(shots / "history.png"), full_page=True)

            page.locator("#changelist-filter").get_by_role("link", name="Error",
                                                           exact=True).click()
            expect(page).to_have_url(re.compile(r"outcome__exact=error"))
            rows = page.locator("#result_list tbody tr")
            # Only errors listed. browser-foo may have one too: a write of its Deployment can
            # meet the Deployment controller's own (409 Conflict) and is retried.
            outcomes = page.locator("#result_list tbody td.field-outcome_col")
            expect(outcomes.first).to_have_text("error")
            assert set(outcomes.all_inner_texts()) == {"error"}, outcomes.all_inner_texts()
            squatter = rows.filter(has_text="squatter")
            expect(squatter.first).to_be_visible()

            squatter.first.locator("th a, td a").first.click()
            expect(page.locator("body")).to_contain_text("NotOwnedError")
            expect(page.locator("body")).to_contain_text("already exists and is not managed by Foo")

            page.goto(f"{web}/admin/")
            page.get_by_role("link", name="Resync one object").click()
            page.select_option("#id_reconciler", FOO)
            page.fill("#id_namespace", namespace)
            page.fill("#id_name", "browser-foo")
            page.click("input[type=submit]")
            expect(page.locator("ul.messagelist")).to_contain_text("enqueued for a manual resync")

            wait_for(lambda: ReconcileRecord.objects.filter(
                name="browser-foo", triggers__contains=["manual"]).exists(), 60,
                "the manual run")
            page.goto(f"{web}/admin/reconcilers/reconcilerecord/?q=browser-foo&trigger=manual")
            expect(page.locator("#result_list")).to_contain_text("manual")
            # The object's timeline: the run, and the manual action that caused it.
            page.locator("#result_list tbody tr").first.get_by_role(
                "link", name=f"{namespace}/browser-foo").click()
            expect(page.locator("#timeline")).to_contain_text("manual: resync")
            expect(page.locator("#timeline")).to_contain_text("caused by manual action")

            page.goto(f"{web}/admin/reconcilers/registeredreconciler/dashboard/")
            expect(page.locator("svg").first).to_be_visible()
            page.screenshot(path=str(shots / "dashboard.png"), full_page=True)
        finally:
            browser.close()
