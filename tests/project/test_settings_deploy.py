"""Production settings: ``manage.py check --deploy`` passes with a production environment.

Each case runs ``manage.py`` in a fresh process with only the variables given here (plus PATH and
HOME), so neither this test run's settings nor ``.local/env`` leak in.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def production_env(**overrides: str) -> dict[str, str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "OPERATOR_ENV_FILE": "/nonexistent",
        "DJANGO_SETTINGS_MODULE": "operator_project.settings",
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DATABASE_URL": os.environ.get("DATABASE_URL",
                                       "postgres://operator:operator@127.0.0.1:15432/operator"),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0"),
        "ALLOWED_HOSTS": "operator.example.com",
        "CSRF_TRUSTED_ORIGINS": "https://operator.example.com",
        "SECURE_HSTS_SECONDS": "31536000",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
        "SECURE_HSTS_PRELOAD": "1",
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )


def test_check_deploy_passes_behind_a_tls_terminating_proxy():
    result = check_deploy(production_env(SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https"))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_passes_when_django_redirects_to_https_itself():
    result = check_deploy(production_env())

    assert result.returncode == 0, result.stdout + result.stderr


def test_check_deploy_reports_cookies_sent_over_plain_http():
    result = check_deploy(production_env(SESSION_COOKIE_SECURE="0", CSRF_COOKIE_SECURE="0"))

    assert result.returncode != 0
    assert "security.W012" in result.stderr and "security.W016" in result.stderr


def test_check_deploy_reports_a_proxy_that_does_not_redirect_when_none_is_declared():
    result = check_deploy(production_env(SECURE_SSL_REDIRECT="0"))

    assert result.returncode != 0
    assert "security.W008" in result.stderr


@pytest.mark.parametrize("missing", ["SECRET_KEY", "DATABASE_URL"])
def test_production_refuses_to_start_without_a_required_variable(missing):
    result = check_deploy(production_env(**{missing: None}))

    assert result.returncode != 0
    assert f"{missing} must be set when DEBUG is off" in result.stderr


def test_a_malformed_proxy_header_is_a_clear_error():
    result = check_deploy(production_env(SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto"))

    assert result.returncode != 0
    assert "SECURE_PROXY_SSL_HEADER must be 'HTTP_<HEADER>,<value>'" in result.stderr


@pytest.mark.parametrize("variable,value", [
    ("SECRET_KEY", "change-me-to-a-long-random-string"),
    ("DATABASE_URL", "postgres://operator:change-me@127.0.0.1:15432/operator"),
    ("REDIS_URL", "redis://:change-me@127.0.0.1:16379/0"),
    ("DJANGO_SUPERUSER_PASSWORD", "change-me"),
])
def test_production_refuses_the_example_placeholders(variable, value):
    result = check_deploy(production_env(**{variable: value}))
    assert result.returncode != 0
    assert f"{variable} still hold the 'change-me' placeholder" in result.stderr


def test_the_image_build_context_leaves_out_cluster_credentials_and_secrets():
    """docs/running/compose.md has users write operator-kubeconfig and .env into this
    directory."""
    import fnmatch

    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

    def ignored(path: str) -> bool:
        """Docker's rule: a pattern matching a directory leaves out everything inside it."""
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        return any(fnmatch.fnmatch(prefix, p) for p in patterns for prefix in prefixes) or any(
            fnmatch.fnmatch(parts[-1], p[3:]) for p in patterns if p.startswith("**/"))

    for path in ("operator-kubeconfig", "kubeconfig", "prod.kubeconfig", ".kube/config",
                 "deploy/kubeconfig",
                 ".env", ".env.production", "tests/settings.py", ".local/kubeconfig"):
        assert ignored(path), path
    for path in ("manage.py", "reconcilers/_run/runner.py", "requirements.lock"):
        assert not ignored(path), path


def test_the_readmes_production_settings_leave_only_the_opt_in_hsts_warnings():
    """docs/running/compose.md, "Where the admin is": exactly the settings it shows, and what
    it says remains."""
    doc = (REPO / "docs" / "running" / "compose.md").read_text()
    assert "reports only\n`security.W005` and `security.W021`" in doc
    result = check_deploy(production_env(
        ALLOWED_HOSTS="operator.example.com", CSRF_TRUSTED_ORIGINS="https://operator.example.com",
        SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https", SECURE_HSTS_SECONDS="3600",
        SECURE_HSTS_INCLUDE_SUBDOMAINS=None, SECURE_HSTS_PRELOAD=None))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert set(re.findall(r"\((?:security|reconcilers)\.\w+\)", output)) == {
        "(security.W005)", "(security.W021)"}, output


def test_operator_apps_are_installed_from_the_environment():
    """How the image and compose take a user's apps without editing the project's files."""
    script = ("import django; django.setup(); from reconcilers._authoring.registry import registry; "
              "print(sorted(registry.names()))")
    env = production_env(OPERATOR_APPS="tests.operatorapp")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "probes.test.operator.local" in result.stdout
    without = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=production_env(),
                             capture_output=True, text=True, timeout=120)
    assert without.stdout.strip() == "[]", without.stdout + without.stderr


def _web_apps_installed(env: dict[str, str], command: str) -> str:
    script = (f"import sys; sys.argv = ['manage.py', {command!r}]; import django; "
              "django.setup(); from django.conf import settings; "
              "print(sorted(set(settings.WEB_APPS) & set(settings.INSTALLED_APPS)))")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("command", ["watch", "runserver", "migrate"])
def test_every_command_installs_the_same_apps(command):
    """The settings never look at the command line: the watcher, the web role and `migrate`
    run with the apps a project of your own would give them."""
    assert _web_apps_installed(production_env(), command) == str(sorted(
        ["django.contrib.admin", "django.contrib.messages", "django.contrib.sessions",
         "django.contrib.staticfiles"]))


def test_a_process_that_serves_no_pages_may_leave_the_web_apps_out():
    """OPERATOR_SERVES_PAGES=0, for the watcher: the admin, sessions, messages and static files
    are left out, and the operator's apps still load."""
    env = production_env(OPERATOR_SERVES_PAGES="0", OPERATOR_APPS="tests.operatorapp")
    assert _web_apps_installed(env, "watch") == "[]"
    script = ("import django; django.setup(); from reconcilers._authoring.registry import registry; "
              "print(sorted(registry.names()))")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "probes.test.operator.local" in result.stdout
    # The system checks load the URLconf, as `migrate` and a Celery worker's start do: it
    # must not name the admin that is not there.
    check = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
