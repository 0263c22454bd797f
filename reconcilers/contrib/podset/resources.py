"""``PodSet``: N Pods matching a selector, made from a template - a ReplicaSet, simplified.

``manage.py makecrds`` writes ``crds/podsets.samples.django-crd-operator.io.yaml`` from it.
"""

from reconcilers.resources import PrinterColumn, Resource, fields


class PodTemplate(fields.Object):
    labels = fields.Map(fields.String(), required=True,
                        help_text="Labels of every Pod made; must include the selector's.")
    containers = fields.List(fields.Object(preserve_unknown_fields=True), required=True,
                             min_items=1, help_text="The Pods' containers (a Pod spec's).")


class PodSetSpec(fields.Object):
    replicas = fields.Integer(minimum=0, maximum=100, default=1,
                              help_text="How many Pods matching the selector should exist.")
    selector = fields.Map(fields.String(), required=True,
                          help_text="matchLabels: the Pods this PodSet counts and adopts.")
    template = PodTemplate(required=True, help_text="What a new Pod looks like.")


class PodSetStatus(fields.Object):
    replicas = fields.Integer(minimum=0, help_text="Pods this PodSet controls.")
    ready_replicas = fields.Integer(minimum=0, help_text="Of those, how many are Ready.")
    observed_generation = fields.Integer(help_text="The generation the status describes.")
    conditions = fields.List(fields.Object(preserve_unknown_fields=True),
                             help_text="Ready: every wanted Pod exists and is Ready.")


class PodSet(Resource):
    """Keeps ``spec.replicas`` Pods that match ``spec.selector``."""

    group = "samples.django-crd-operator.io"
    version = "v1alpha1"
    kind = "PodSet"
    spec = PodSetSpec(required=True)
    status = PodSetStatus()

    class Meta:
        plural = "podsets"
        singular = "podset"
        scope = "Namespaced"
        printer_columns = [
            PrinterColumn("Desired", "spec.replicas"),
            PrinterColumn("Current", "status.replicas"),
            PrinterColumn("Ready", "status.ready_replicas"),
            PrinterColumn.age(),
        ]
