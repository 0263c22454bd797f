"""Scaffolding: ``manage.py startoperator`` writes an app whose own test passes against the
real api-server, with a CRD and RBAC that match what the project's commands generate."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.e2e


def _manage(*args: str, env: dict, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "manage.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_scaffolded_operator_passes_its_own_test(tmp_path, stack):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DEBUG": "1",
           "KUBECONFIG": str(stack.kubeconfig)}
    made = _manage("startoperator", "widgets", "Widget", "--directory", str(tmp_path), env=env)
    assert made.returncode == 0, made.stderr
    app = tmp_path / "widgets"
    crd = yaml.safe_load((app / "crds" / "widgets.widgets.example.com.yaml").read_text())
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["spec"]["names"]["kind"] == "Widget"
    role = yaml.safe_load((app / "rbac.yaml").read_text())
    assert {"apiGroups": ["widgets.example.com"], "resources": ["widgets"],
            "verbs": ["get", "list", "patch", "watch"]} in role["rules"]

    # Installed in a project, its files are what the project's own commands generate...
    (tmp_path / "scaffold_settings.py").write_text(
        "from tests.settings import *  # noqa\n"
        "INSTALLED_APPS = [*INSTALLED_APPS, 'widgets']\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    project = {**env, "DJANGO_SETTINGS_MODULE": "scaffold_settings",
               "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    check = _manage("makecrds", "widgets", "--check", env=project)
    assert check.returncode == 0 and "up to date" in check.stdout, check.stdout + check.stderr
    generated = yaml.safe_load(_manage("rbac", env=project).stdout)
    assert all(rule in generated["rules"] for rule in role["rules"])

    # ...and its test passes against the real api-server.
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(app / "tests")], cwd=tmp_path, env=project,
                            capture_output=True, text=True, timeout=300)
    assert "1 passed" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]


def test_bad_names_are_refused_with_a_reason(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DEBUG": "1"}
    for args, reason in ((["Widgets", "Widget"], "not a usable app name"),
                         (["widgets", "widget"], "not a Kubernetes kind"),
                         (["widgets", "Widget", "--group", "nodot"], "not an API group"),
                         (["widgets", "Widget", "--api-version", "1"], "not a Kubernetes version")):
        result = _manage("startoperator", *args, "--directory", str(tmp_path), env=env)
        assert result.returncode != 0 and reason in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing half-written
