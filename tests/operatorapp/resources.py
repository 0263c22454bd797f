"""``Gauge``: two versions whose fields differ, converted by the webhook (hub: v1alpha1).

v1alpha1 says ``spec.replicas``; v1 renamed it ``spec.scale.count``. Its admission hooks are
written against the hub, so a v1 write reaches them converted.
"""

from reconcilers.api import ValidationError
from reconcilers.resources import Resource, Version, fields


class HubSpec(fields.Object):
    replicas = fields.Integer(minimum=0)


class Scale(fields.Object):
    count = fields.Integer(minimum=0)


class SpokeSpec(fields.Object):
    scale = Scale()


def to_hub(obj: dict) -> dict:
    spec = obj.get("spec") or {}
    count = (spec.get("scale") or {}).get("count")
    obj["spec"] = {k: v for k, v in spec.items() if k != "scale"}
    if count is not None:
        obj["spec"]["replicas"] = count
    return obj


def from_hub(obj: dict) -> dict:
    spec = obj.get("spec") or {}
    replicas = spec.get("replicas")
    obj["spec"] = {k: v for k, v in spec.items() if k != "replicas"}
    if replicas is not None:
        obj["spec"]["scale"] = {"count": replicas}
    return obj


class Gauge(Resource):
    group = "conversion.operator.local"
    versions = [Version("v1alpha1", storage=True, spec=HubSpec()),
                Version("v1", spec=SpokeSpec(), to_hub=to_hub, from_hub=from_hub)]

    def default(self, request) -> None:
        """A Gauge without replicas gets 1."""
        spec = self.raw.setdefault("spec", {})
        if spec.get("replicas") is None:
            spec["replicas"] = 1

    def validate(self, old, request) -> list[str]:
        if (self.raw.get("spec") or {}).get("replicas", 0) > 10:
            raise ValidationError("spec.replicas", "at most 10 replicas")
        return []
