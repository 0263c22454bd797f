"""``manage.py bundle``: an OLM bundle whose CSV claims only the capability level the runs
evidence, checked by the operator-framework's own bundle validation (its Go library, built from
the module proxy by ``reconcilers/devstack/build-bundle-validator.sh``)."""

from __future__ import annotations

import json
import subprocess
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from reconcilers._authoring import bundle, deploydir, rbac
from reconcilers._authoring.registry import registry
from reconcilers._run import evidence
from reconcilers.models import ReconcileRecord

pytestmark = pytest.mark.django_db(transaction=True)

FOO = "foos.samplecontroller.k8s.io"
DEPLOY = Path(django_settings.BASE_DIR) / "deploy"
BUILD = Path(__file__).resolve().parents[2] / "reconcilers/devstack/build-bundle-validator.sh"


@pytest.fixture(scope="session")
def validator() -> str:
    """The validator binary (built once per version and cached, as the control plane is)."""
    return subprocess.run(["bash", str(BUILD)], check=True, capture_output=True,
                          text=True).stdout.strip()


def validate(validator: str, directory: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([validator, *flags, str(directory)], capture_output=True, text=True)


@pytest.fixture(autouse=True)
def foo_is_registered():
    if FOO not in registry:
        pytest.skip("the samples are off (OPERATOR_SAMPLES)")
    evidence._recorded.clear()  # the per-process memo outlives the flushed test database


def basic_install_runs(reconciler: str = FOO) -> ReconcileRecord:
    """A run that shows every level-1 criterion, recorded as the runner records it."""
    now = timezone.now()
    record = ReconcileRecord.objects.create(
        reconciler=reconciler, namespace="ns", name="example-foo", started_at=now,
        finished_at=now, duration_ms=1, outcome="success", generation=1, observed_generation=1,
        conditions=[{"type": "Ready", "status": "True"}])
    evidence.record_evidence(record, 0)
    return record


def bundle_command(out: Path, *args: str) -> tuple[str, str]:
    stdout, stderr = StringIO(), StringIO()
    call_command("bundle", "samplecontroller", "--output", str(out), *args, stdout=stdout,
                 stderr=stderr)
    return stdout.getvalue(), stderr.getvalue()


def csv_of(out: Path) -> dict:
    return yaml.safe_load((out / "manifests/django-crd-operator.clusterserviceversion.yaml")
                          .read_text())


def test_the_foo_bundle_passes_the_operator_frameworks_validation(tmp_path, validator):
    basic_install_runs()
    out = tmp_path / "bundle"
    stdout, stderr = bundle_command(out, "--provider", "Example Inc.")
    assert "capabilities: Basic Install (level 1; evidenced: 1)" in stdout
    assert "Namespace django-crd-operator (OLM installs into the namespace" in stderr
    assert "warning: the CSV owns the CRDs of the samples" in stderr
    csv = csv_of(out)
    assert csv["metadata"]["annotations"]["capabilities"] == "Basic Install"
    assert csv["metadata"]["annotations"][bundle.EVIDENCED_ANNOTATION] == "1"
    assert bundle.UNEVIDENCED_ANNOTATION not in csv["metadata"]["annotations"]
    assert (out / "manifests/samplecontroller.k8s.io_foos.yaml").is_file()
    assert yaml.safe_load((out / "metadata/annotations.yaml").read_text())["annotations"][
        "operators.operatorframework.io.bundle.package.v1"] == "django-crd-operator"

    result = validate(validator, out, "-operatorhub")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "permissions to create CRD" not in result.stdout  # OLM installs the CRDs
    version = deploydir.default_version(DEPLOY)  # deploy/'s image tag, the release's version
    assert result.stdout.splitlines()[-1] == (
        f"OK: django-crd-operator.v{version} (package django-crd-operator, channels [alpha])")


def test_the_validator_catches_a_bundle_missing_its_crd(tmp_path, validator):
    """The check above can fail: a CSV owning a CRD the bundle lacks is an error."""
    basic_install_runs()
    out = tmp_path / "bundle"
    bundle_command(out)
    (out / "manifests/samplecontroller.k8s.io_foos.yaml").unlink()
    result = validate(validator, out)
    assert result.returncode == 1
    assert 'owned CRD "samplecontroller.k8s.io/v1alpha1, Kind=Foo" not found' in result.stdout


def test_a_claim_beyond_the_evidence_is_refused_with_the_admins_reason(tmp_path):
    basic_install_runs()
    out = tmp_path / "bundle"
    with pytest.raises(CommandError) as refused:
        bundle_command(out, "--claim-level", "2")
    admins_reason = evidence.score(FOO)[1].why  # what the Reconcilers page shows for level 2
    assert admins_reason.startswith("not met: ")
    assert f"{FOO}: level 2 (Seamless Upgrades) {admins_reason}" in str(refused.value)
    assert "the evidenced level is 1" in str(refused.value)
    assert not out.exists()


def test_no_evidence_at_all_is_refused_even_for_basic_install(tmp_path):
    out = tmp_path / "bundle"
    with pytest.raises(CommandError, match="level 1 \\(Basic Install.*no successful run yet"):
        bundle_command(out)
    assert not out.exists()


def test_force_writes_the_claim_and_says_in_the_csv_that_it_is_not_evidenced(tmp_path,
                                                                              validator):
    basic_install_runs()
    out = tmp_path / "bundle"
    _, stderr = bundle_command(out, "--claim-level", "3", "--force")
    assert "claiming level 3 beyond the evidence (evidenced: 1)" in stderr
    annotations = csv_of(out)["metadata"]["annotations"]
    assert annotations["capabilities"] == "Full Lifecycle"
    assert annotations[bundle.EVIDENCED_ANNOTATION] == "1"
    assert annotations[bundle.UNEVIDENCED_ANNOTATION].startswith(
        f"Full Lifecycle claimed beyond the evidence: {FOO}: level 2 (Seamless Upgrades) "
        "not met: ")
    assert validate(validator, out).returncode == 0


def test_force_without_a_claim_is_an_error(tmp_path):
    with pytest.raises(CommandError, match="--force needs --claim-level"):
        bundle_command(tmp_path / "bundle", "--force")


def test_a_project_without_reconcilers_gets_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_classes", {})
    with pytest.raises(CommandError, match="no reconcilers are registered: a bundle installs"):
        call_command("bundle", "--output", str(tmp_path / "bundle"))
    assert not (tmp_path / "bundle").exists()


def test_an_app_without_reconcilers_gets_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="no reconcilers are registered in auth"):
        call_command("bundle", "auth", "--output", str(tmp_path / "bundle"))


def test_a_project_watching_some_namespaces_is_refused():
    with pytest.raises(bundle.BundleError, match="AllNamespaces install mode only"):
        bundle.build([registry.get_class(FOO)], DEPLOY, options(), ["team-a"])


# --- the CSV builder ------------------------------------------------------------------------

def options(**kw) -> bundle.Options:
    values = dict(package="django-crd-operator", version="0.11.0", channels=("alpha",),
                  default_channel="alpha", claim=bundle.LevelClaim(1, 1))
    values.update(kw)
    return bundle.Options(**values)


def foo_csv(**kw) -> tuple[bundle.Bundle, dict]:
    made = bundle.build([registry.get_class(FOO)], DEPLOY, options(**kw))
    return made, made.manifests["django-crd-operator.clusterserviceversion.yaml"]


def test_the_install_strategy_is_deploys_deployments_with_the_generated_rbac():
    made, csv = foo_csv(image="registry.example.com/team/op:1.2.3")
    strategy = csv["spec"]["install"]
    assert strategy["strategy"] == "deployment"
    deployments = {d["name"]: d["spec"] for d in strategy["spec"]["deployments"]}
    assert set(deployments) == {"django-crd-operator-watcher", "django-crd-operator-worker",
                                "django-crd-operator-web"}
    pods = {name: spec["template"]["spec"] for name, spec in deployments.items()}
    assert {c["image"] for p in pods.values() for c in p["containers"]} == {
        "registry.example.com/team/op:1.2.3"}
    # OLM installs no Job: the migrate Job runs first in the admin's pods.
    (init,) = pods["django-crd-operator-web"]["initContainers"]
    assert "manage.py migrate" in " ".join(init["command"])
    assert init["image"] == "registry.example.com/team/op:1.2.3"
    # The Lease lives in whatever namespace OLM installs into.
    (watcher,) = pods["django-crd-operator-watcher"]["containers"]
    watcher_env = {e["name"]: e for e in watcher["env"]}
    assert watcher_env["RECONCILERS_LEASE_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}}
    assert strategy["spec"]["clusterPermissions"] == [{
        "serviceAccountName": "django-crd-operator",
        "rules": [r for r in rbac.rules_for([registry.get_class(FOO)])
                  if "customresourcedefinitions" not in r["resources"]]}]
    assert len(strategy["spec"]["clusterPermissions"][0]["rules"]) >= 5
    assert strategy["spec"]["permissions"] == [
        {"serviceAccountName": "django-crd-operator-web", "rules": []}]
    assert [m["type"] for m in csv["spec"]["installModes"] if m["supported"]] == ["AllNamespaces"]
    assert any("Namespace django-crd-operator" in n for n in made.left_out)
    assert "django-crd-operator_v1_configmap.yaml" in made.manifests


def test_bundling_a_sample_that_deploys_settings_turn_off_says_so(tmp_path):
    made, _ = foo_csv()
    (warning,) = made.warnings
    assert warning.startswith(f"the CSV owns the CRDs of the samples ({FOO}), but ")
    assert "sets OPERATOR_SAMPLES off" in warning

    deploy = tmp_path / "deploy"
    deploy.mkdir()
    for path in DEPLOY.glob("*.yaml"):
        (deploy / path.name).write_text(path.read_text().replace(
            'OPERATOR_SAMPLES: "0"', 'OPERATOR_SAMPLES: "1"'))
    assert bundle.build([registry.get_class(FOO)], deploy, options()).warnings == []


def test_the_image_defaults_to_the_kustomizations():
    _, csv = foo_csv()
    assert csv["metadata"]["annotations"]["containerImage"] == (
        f"django-crd-operator:{deploydir.default_version(DEPLOY)}")


def test_the_csv_owns_the_reconcilers_crds_with_their_examples():
    made, csv = foo_csv()
    assert csv["spec"]["customresourcedefinitions"]["owned"] == [{
        "name": FOO, "version": "v1alpha1", "kind": "Foo", "displayName": "Foo",
        "description": made.manifests["samplecontroller.k8s.io_foos.yaml"]["spec"]["versions"][0]
        ["schema"]["openAPIV3Schema"]["description"]}]
    examples = json.loads(csv["metadata"]["annotations"]["alm-examples"])
    assert [(e["kind"], e["metadata"]["name"]) for e in examples] == [("Foo", "example-foo")]


def test_a_kind_with_two_reconcilers_is_one_owned_crd_with_its_examples_once():
    from reconcilers.api import Reconciler

    class FooLabeller(Reconciler):
        name = "foo-labeller"
        group, version, kind = "samplecontroller.k8s.io", "v1alpha1", "Foo"

    FooLabeller.__module__ = "reconcilers.contrib.samplecontroller.reconcilers"
    made = bundle.build([registry.get_class(FOO), FooLabeller], DEPLOY, options())
    csv = made.manifests["django-crd-operator.clusterserviceversion.yaml"]
    assert [o["name"] for o in csv["spec"]["customresourcedefinitions"]["owned"]] == [FOO]
    examples = json.loads(csv["metadata"]["annotations"]["alm-examples"])
    assert [(e["kind"], e["metadata"]["name"]) for e in examples] == [("Foo", "example-foo")]


def test_the_annotations_name_the_package_and_its_channels():
    made, _ = foo_csv(channels=("stable", "fast"), default_channel="fast")
    assert made.annotations == {
        "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
        "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
        "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
        "operators.operatorframework.io.bundle.package.v1": "django-crd-operator",
        "operators.operatorframework.io.bundle.channels.v1": "stable,fast",
        "operators.operatorframework.io.bundle.channel.default.v1": "fast",
    }


@pytest.mark.parametrize("kw, message", [
    ({"version": "v1"}, "not a semantic version"),
    ({"package": "My_Operator"}, "not a DNS label"),
    ({"default_channel": "beta"}, "is not one of the channels"),
    ({"channels": ("a,b",), "default_channel": "a,b"}, "without commas"),
])
def test_bad_options_are_refused_with_the_reason(kw, message):
    with pytest.raises(bundle.BundleError, match=message):
        foo_csv(**kw)


def test_a_deploy_dir_without_a_kustomization_is_refused(tmp_path):
    with pytest.raises(bundle.BundleError, match="kustomization.yaml does not exist"):
        bundle.build([registry.get_class(FOO)], tmp_path, options())


def test_a_crd_converting_through_a_webhook_is_refused():
    from reconcilers.api import Reconciler
    from tests.operatorapp.resources import Gauge

    class GaugeReconciler(Reconciler):  # not registered: only its declaration is read
        resource = Gauge

    with pytest.raises(bundle.BundleError, match="converts through a webhook: OLM serves"):
        bundle.build([GaugeReconciler], DEPLOY, options())


def test_a_kind_no_bundle_can_hold_is_refused_naming_its_file(tmp_path):
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    for path in DEPLOY.glob("*.yaml"):
        (deploy / path.name).write_text(path.read_text())
    (deploy / "ingress.yaml").write_text(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: web}\n")
    (deploy / "kustomization.yaml").write_text(
        (deploy / "kustomization.yaml").read_text().replace(
            "  - web.yaml\n", "  - web.yaml\n  - ingress.yaml\n"))
    with pytest.raises(bundle.BundleError, match="ingress.yaml: Ingress web cannot go in an OLM bundle"):
        bundle.build([registry.get_class(FOO)], deploy, options())


def test_writing_again_removes_files_of_an_earlier_bundle(tmp_path):
    made, _ = foo_csv()
    (tmp_path / "manifests").mkdir()
    stale = tmp_path / "manifests" / "old_crd.yaml"
    stale.write_text("kind: CustomResourceDefinition\n")
    bundle.write(made, tmp_path)
    assert not stale.exists()
    assert (tmp_path / "manifests/django-crd-operator.clusterserviceversion.yaml").is_file()
