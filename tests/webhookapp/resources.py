"""Deployments judged by a ``Webhook`` class: a label added, ``:latest`` images refused, and a
Deployment annotated ``webhook-test/protected: "true"`` kept from deletion."""

from reconcilers.api import ValidationError, Webhook

PROTECTED = "webhook-test/protected"


class DeploymentPolicy(Webhook):
    group, version, kind = "apps", "v1", "Deployment"

    def default(self, request) -> None:
        self.raw["metadata"].setdefault("labels", {})["webhook-test/policy"] = "checked"

    def validate(self, old, request) -> list[str]:
        for container in self.raw["spec"]["template"]["spec"]["containers"]:
            if container["image"].endswith(":latest") or ":" not in container["image"]:
                raise ValidationError("spec.template.spec.containers",
                                      f"image {container['image']!r}: pin a tag")
        return []

    def validate_delete(self, request) -> list[str]:
        if (self.raw["metadata"].get("annotations") or {}).get(PROTECTED) == "true":
            raise ValidationError(f"Deployment {request.name} is protected: remove the "
                                  f"{PROTECTED} annotation first")
        return []
