"""``python manage.py startoperator <app> <Kind>``: a new app with a working operator.

Like kubebuilder's ``create api``: the app gets a typed resource (``resources.py``), a
reconciler that writes status and a ``Ready`` condition (``reconcilers.py``), the CRD generated
from the resource (``crds/``), the least-privilege ClusterRole its reconciler needs
(``rbac.yaml``) and a test that passes against a real api-server with ``reconcilers.testing``.
Add the app to ``INSTALLED_APPS``, then change the resource's fields and ``reconcile``; rerun
``manage.py makecrds`` and ``manage.py rbac`` when they change.
"""

from __future__ import annotations

import importlib
import keyword
import re
import sys
from pathlib import Path

import yaml
from django.core.management.base import BaseCommand, CommandError

from reconcilers._authoring import rbac
from reconcilers.resources.crd import render
from reconcilers._base.vocab import plural

FILES = {
    "__init__.py": "",
    "apps.py": '''from django.apps import AppConfig


class {App}Config(AppConfig):
    name = "{app}"
    verbose_name = "{Kind} operator"
''',
    "resources.py": '''"""The {Kind} custom resource, declared once: ``manage.py makecrds`` writes its CRD."""

from reconcilers.resources import Resource, fields


class {Kind}Spec(fields.Object):
    message = fields.String(required=True, min_length=1, max_length=200,
                            help_text="What the {Kind} asks for (replace with your fields).")


class {Kind}Status(fields.Object):
    observed_message = fields.String(help_text="The message last acted on.")
    observed_generation = fields.Integer(help_text="The generation last acted on.")
    conditions = fields.List(fields.Object(preserve_unknown_fields=True),
                             help_text="Ready, and any other condition the operator reports.")


class {Kind}(Resource):
    """A {Kind}."""

    group = "{group}"
    version = "{version}"
    kind = "{Kind}"
    spec = {Kind}Spec(required=True)
    status = {Kind}Status()

    class Meta:
        plural = "{plural}"
        scope = "Namespaced"
''',
    "reconcilers.py": '''"""Reconcile a {Kind}: act on its spec, then say so in its status."""

from reconcilers.api import Reconciler, events, register

from .resources import {Kind}


@register
class {Kind}Reconciler(Reconciler):
    resource = {Kind}
    capability_level = 1

    def reconcile(self, obj: {Kind}, ctx):
        # Act on obj.spec here: create or update children with ctx.create_or_update(...),
        # declared in `owns` so their changes reconcile this {Kind} too.
        obj.status.observed_message = obj.spec.message
        ctx.set_condition("Ready", True, "Reconciled", f"acted on {{obj.spec.message!r}}")
        ctx.event(events.NORMAL, "Reconciled", "{Kind} reconciled")
''',
    "tests/__init__.py": "",
    "tests/test_{kind}.py": '''"""The {Kind} operator against a real api-server (``KUBECONFIG``), one reconcile in-process."""

from pathlib import Path

from reconcilers.testing import (api_request, apply_crd, k8s_namespace,  # noqa: F401 (fixtures)
                                 kube_api, reconcile_once)

CRD = Path(__file__).resolve().parent.parent / "crds" / "{plural}.{group}.yaml"


def test_a_{kind}_is_reconciled_and_reports_ready(kube_api, k8s_namespace):  # noqa: F811
    apply_crd(kube_api, CRD)
    collection = f"/apis/{group}/{version}/namespaces/{{k8s_namespace}}/{plural}"
    api_request(kube_api, "POST", collection,
                {{"apiVersion": "{group}/{version}", "kind": "{Kind}",
                 "metadata": {{"name": "example"}}, "spec": {{"message": "hello"}}}})

    run = reconcile_once("{plural}.{group}", k8s_namespace, "example")

    assert run.outcome == "success", run.error
    status = run.obj["status"]
    assert status["observedMessage"] == "hello"
    assert status["observedGeneration"] == run.obj["metadata"]["generation"]
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Ready", "True")]
''',
}


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser) -> None:
        parser.add_argument("app", help="the new app's name (a Python identifier)")
        parser.add_argument("kind", help="the custom resource's kind, e.g. Widget")
        parser.add_argument("--group", help="API group (default: <app>.example.com)")
        parser.add_argument("--api-version", dest="api_version", default="v1alpha1",
                            help="API version (default: v1alpha1)")
        parser.add_argument("--directory", default=".", help="where the app goes (default: .)")

    def handle(self, *args, app: str, kind: str, group: str | None, api_version: str,
               directory: str, **options) -> None:
        if not app.isidentifier() or keyword.iskeyword(app) or not app.islower():
            raise CommandError(f"{app!r} is not a usable app name: lower case, a Python "
                               "identifier (e.g. widgets)")
        if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", kind):
            raise CommandError(f"{kind!r} is not a Kubernetes kind: CamelCase, e.g. Widget")
        group = group or f"{app.replace('_', '-')}.example.com"
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+",
                            group):
            raise CommandError(f"{group!r} is not an API group: a DNS name with a dot")
        if not re.fullmatch(r"v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?", api_version):
            raise CommandError(f"{api_version!r} is not a Kubernetes version (v1, v1beta1, ...)")
        root = Path(directory).resolve()
        target = root / app
        if target.exists():
            raise CommandError(f"{target} already exists")
        names = {"app": app, "App": app.title().replace("_", ""), "Kind": kind,
                 "kind": kind.lower(), "group": group, "version": api_version,
                 "plural": plural(kind)}
        for relative, template in FILES.items():
            path = target / relative.format(**names)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(template.format(**names))

        sys.path.insert(0, str(root))
        try:
            resource = getattr(importlib.import_module(f"{app}.resources"), kind)
            reconciler = getattr(importlib.import_module(f"{app}.reconcilers"),
                                 f"{kind}Reconciler")
        finally:
            sys.path.remove(str(root))
        crd_path = target / "crds" / f"{resource._meta.crd_name}.yaml"
        crd_path.parent.mkdir()
        crd_path.write_text(render(resource))
        (target / "rbac.yaml").write_text(
            "# Generated by `manage.py startoperator`; regenerate with `manage.py rbac`.\n"
            + yaml.safe_dump(rbac.cluster_role([reconciler], name=f"{app}-operator"),
                             sort_keys=False))
        self.stdout.write(f"Created {target}: add {app!r} to INSTALLED_APPS, apply "
                          f"{crd_path.relative_to(root)}, and run its test.")
