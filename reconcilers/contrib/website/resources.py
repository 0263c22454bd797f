"""``Website``: a page of content served by nginx, and optionally a Service in front of it.

``manage.py makecrds website`` writes ``crds/websites.samples.django-crd-operator.io.yaml``.
"""

from reconcilers.resources import PrinterColumn, Resource, fields


class WebsiteSpec(fields.Object):
    content = fields.String(default="<h1>Hello</h1>", max_length=65536,
                            help_text="The page served as index.html.")
    replicas = fields.Integer(minimum=1, maximum=10, default=1,
                              help_text="How many Pods serve it.")
    image = fields.String(default="nginx:1.27", help_text="The serving container's image.")
    expose = fields.Boolean(default=True,
                            help_text="Put a Service in front of it once it is available.")
    node_selector = fields.Map(fields.String(),
                               help_text="Where its Pods may run (a Pod's nodeSelector).")


class WebsiteStatus(fields.Object):
    available_replicas = fields.Integer(minimum=0, help_text="Available serving Pods.")
    url = fields.String(help_text="Where it is served inside the cluster, once exposed.")
    observed_generation = fields.Integer(help_text="The generation the status describes.")
    conditions = fields.List(
        fields.Object(preserve_unknown_fields=True),
        help_text="ContentReady, ServerReady, ServiceReady and DependentsReady.")


class Website(Resource):
    """Serves ``spec.content``; a ConfigMap, then a Deployment, then a Service."""

    group = "samples.django-crd-operator.io"
    version = "v1alpha1"
    kind = "Website"
    spec = WebsiteSpec(required=True)
    status = WebsiteStatus()

    class Meta:
        plural = "websites"
        singular = "website"
        scope = "Namespaced"
        printer_columns = [
            PrinterColumn("Replicas", "spec.replicas"),
            PrinterColumn("Available", "status.available_replicas"),
            PrinterColumn("URL", "status.url"),
            PrinterColumn.age(),
        ]
