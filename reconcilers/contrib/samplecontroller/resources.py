"""kubernetes/sample-controller's ``Foo``, declared as a typed resource.

Same group, version and fields as upstream's ``artifacts/examples/crd-status-subresource.yaml``,
with the validation upstream leaves to the controller: a Foo without a valid Deployment name or
with a replica count out of range is rejected by the api-server (422) instead of failing every
reconcile. ``manage.py makecrds`` writes ``crds/foos.samplecontroller.k8s.io.yaml`` from it.

One version, as upstream: the sample runs in every layout the README gives, most of them with
no webhook server, and a CRD that converts through a webhook nobody serves cannot be listed -
by ``kubectl`` or by the namespace controller, which then leaves every namespace holding a Foo
``Terminating``. The admission hooks below are optional: without their server the CRD's own
rules still hold.
"""

from reconcilers.api import ValidationError
from reconcilers.resources import PrinterColumn, Resource, fields

DNS_1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def _deployment_name() -> fields.String:
    return fields.String(
        required=True, min_length=1, max_length=253, pattern=DNS_1123_SUBDOMAIN, immutable=True,
        help_text="Name of the Deployment this Foo owns, in the Foo's namespace; fixed once set "
                  "(a renamed Foo would leave its old Deployment behind).")


def _replicas() -> fields.Integer:
    return fields.Integer(
        minimum=1, maximum=100,
        help_text="Number of replicas of the Deployment; 1 when left out (set by the mutating "
                  "webhook, or by the Deployment's own default without it).")


class FooSpec(fields.Object):
    deployment_name = _deployment_name()
    replicas = _replicas()


class FooStatus(fields.Object):
    available_replicas = fields.Integer(
        minimum=0, help_text="Available replicas of the Deployment, as last observed.")


class Foo(Resource):
    """A Foo asks for a Deployment of nginx with a given name and replica count."""

    group = "samplecontroller.k8s.io"
    version = "v1alpha1"
    kind = "Foo"
    spec = FooSpec(required=True, help_text="The Deployment this Foo wants.")
    status = FooStatus(help_text="What the controller last observed.")

    class Meta:
        plural = "foos"
        singular = "foo"
        scope = "Namespaced"
        # *.k8s.io is a protected group: the api-server refuses the CRD without this.
        annotations = {"api-approved.kubernetes.io": "unapproved, experimental-only; please get "
                       "an approval from Kubernetes API reviewers if you're trying to develop a "
                       "CRD in the *.k8s.io or *.kubernetes.io groups"}
        printer_columns = [
            PrinterColumn("Deployment", "spec.deployment_name"),
            PrinterColumn("Replicas", "spec.replicas"),
            PrinterColumn("Available", "status.available_replicas"),
            PrinterColumn.age(),
        ]

    # --- admission webhooks (manage.py webhook serve / register) ---------------------------

    def default(self, request) -> None:
        """A Foo without replicas gets 1."""
        if self.raw.setdefault("spec", {}).get("replicas") is None:
            self.raw["spec"]["replicas"] = 1

    def validate(self, old, request) -> list[str]:
        """Two Foos of one namespace may not name the same Deployment: the second would fight
        the first for it (something a CRD's CEL rules cannot see, as it spans objects)."""
        wanted = self.raw["spec"].get("deploymentName")
        for other in request.lister.list(self.api_version, "Foo", request.namespace):
            if (other["metadata"]["name"] != request.name
                    and (other.get("spec") or {}).get("deploymentName") == wanted):
                raise ValidationError(
                    "spec.deploymentName",
                    f'Deployment "{wanted}" is already named by Foo "{other["metadata"]["name"]}"')
        return []
