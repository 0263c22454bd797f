"""Admission webhooks declared on typed resources: ``validate`` and ``default`` in plain Python.

    class Foo(Resource):
        ...
        def default(self, request):                  # mutating: change self.raw / self.spec
            if self.raw["spec"].get("replicas") is None:
                self.raw["spec"]["replicas"] = 1

        def validate(self, old, request):            # validating: raise ValidationError
            if old is not None and ...:
                raise ValidationError("spec.replicas", "may not shrink below 1")
            return ["a warning the client prints"]   # optional

``review(body, mutate=...)`` answers one ``AdmissionReview`` (admission.k8s.io/v1): the
object's resource class is found by group/version/resource in the resource registry, the
hook runs, and the response carries ``allowed``, a ``status`` with the message (and the field
path) when denied, a base64 JSONPatch for a mutation, and warnings. ``request.dry_run`` says
the api-server will not persist the object: a hook with side effects must skip them. A
request that is not an AdmissionReview raises ``BadReview`` (the server answers 400), and a
hook that raises anything else denies the request with its message - never a crashed server.

Deletion: ``validate_delete(self, request)`` on the object being deleted (the api-server's
``oldObject``) adds DELETE to the validating webhook's operations; raising denies the
deletion. Mind that a denied DELETE also stops the namespace controller deleting the object's
namespace, and a garbage collector deleting it as an orphan.

Kinds this project does not declare - a built-in one (a Pod, a Deployment) or another
operator's CRD - get the same three hooks on a ``Webhook`` class, registered on definition
as a ``Resource`` is (declare it in an app's ``resources.py``, which ``autodiscover``
imports)::

    class DeploymentPolicy(Webhook):
        group, version, kind = "apps", "v1", "Deployment"

        def validate(self, old, request):
            for c in self.raw["spec"]["template"]["spec"]["containers"]:
                if c["image"].endswith(":latest"):
                    raise ValidationError("spec.template.spec.containers", "pin a tag")
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured

from reconcilers._kube import kube
from reconcilers._kube.lister import Lister
from reconcilers.resources import KindRegistry, default_registry
from reconcilers.resources.typed import MetadataView
from reconcilers._base.vocab import plural as plural_of

log = logging.getLogger(__name__)

VALIDATE, MUTATE, CONVERT = "validate", "mutate", "convert"


class ValidationError(Exception):
    """Deny the request: ``ValidationError("spec.replicas", "must be at most 10")`` (the
    field path is optional)."""

    def __init__(self, field_or_message: str, message: str | None = None):
        self.field = field_or_message if message is not None else ""
        self.message = message if message is not None else field_or_message
        super().__init__(f"{self.field}: {self.message}" if self.field else self.message)


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 request this server can answer."""


@dataclass
class AdmissionRequest:
    """What a hook learns of the request besides the object."""

    uid: str
    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    namespace: str
    name: str
    dry_run: bool
    user: str
    lister: Lister  # reads (other objects of the kind, say), from the api-server
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Answer:
    """One answered call, for the response and for the record of it."""

    response: dict
    resource: str
    namespace: str
    name: str
    operation: str
    hook: str
    allowed: bool
    message: str
    dry_run: bool
    seconds: float


# --- hooks on kinds this project does not declare ---------------------------------------------


@dataclass(frozen=True)
class KindMeta:
    """A ``Webhook`` class's kind, with the attributes of a ``Resource``'s ``_meta`` that
    registration, RBAC and the records read."""

    group: str
    version: str
    kind: str
    plural: str
    scope: str
    converts: ClassVar[bool] = False

    @property
    def crd_name(self) -> str:
        """The registry key and the records' resource: ``deployments.apps``, ``pods``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


webhook_registry = KindRegistry()  # Webhook classes, by KindMeta.crd_name


class Webhook:
    """Admission hooks on a kind declared elsewhere (a built-in one, another operator's CRD).

    Class attributes: ``group`` (``""`` for the core group), ``version``, ``kind``,
    ``plural`` (default: Kubernetes' plural of ``kind``), ``namespaced`` (default True).
    Define any of ``default(self, request)``, ``validate(self, old, request)`` and
    ``validate_delete(self, request)``; ``self.raw`` is the object (a copy: ``default``
    changes it), ``old`` the object before an update. One class per kind; ``Meta.registry =
    None`` registers it nowhere (tests)."""

    group: ClassVar[str] = ""
    version: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    plural: ClassVar[str | None] = None
    namespaced: ClassVar[bool] = True
    _meta: ClassVar[KindMeta]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        meta = vars(cls).get("Meta")
        if not cls.version or not cls.kind:
            raise ImproperlyConfigured(f"{cls.__qualname__} must name the version and kind "
                                       f"it hooks (group too, unless the core group)")
        cls._meta = KindMeta(cls.group, cls.version, cls.kind, cls.plural or plural_of(cls.kind),
                             "Namespaced" if cls.namespaced else "Cluster")
        registry = getattr(meta, "registry", webhook_registry)
        if registry is not None:
            registry.register(cls)

    def __init__(self, obj: dict[str, Any]) -> None:
        self.raw: dict[str, Any] = copy.deepcopy(dict(obj))

    @property
    def metadata(self) -> MetadataView:
        return MetadataView(self.raw.get("metadata") or {})

    def __repr__(self) -> str:
        meta = self.raw.get("metadata") or {}
        where = f"{meta['namespace']}/" if meta.get("namespace") else ""
        return f"<{type(self).__name__} {self.kind} {where}{meta.get('name', '?')}>"


def hooked(cls) -> set[str]:
    """Which hooks a resource (or ``Webhook``) class declares."""
    out = set()
    if callable(getattr(cls, "validate", None)) or callable(getattr(cls, "validate_delete",
                                                                     None)):
        out.add(VALIDATE)
    if callable(getattr(cls, "default", None)):
        out.add(MUTATE)
    if cls._meta.converts:
        out.add(CONVERT)
    return out


def operations(cls, hook: str) -> list[str]:
    """The operations ``hook`` of ``cls`` is called for."""
    if hook == MUTATE:
        return ["CREATE", "UPDATE"]
    ops = ["CREATE", "UPDATE"] if callable(getattr(cls, "validate", None)) else []
    if callable(getattr(cls, "validate_delete", None)):
        ops.append("DELETE")
    return ops


def webhook_name(cls, hook: str) -> str:
    """``validate.foos.samplecontroller.k8s.io``; a kind of a group without dots gets the
    group (``core`` for the core one) after its plural, as the name needs three parts."""
    meta = cls._meta
    if isinstance(meta, KindMeta):
        return f"{hook}.{meta.plural}.{meta.group or 'core'}"
    return f"{hook}.{meta.crd_name}"


def admitted_versions(cls) -> list[str]:
    """A converting kind is admitted in its hub version only: with ``matchPolicy:
    Equivalent`` the api-server converts a request in any other version to it first, so
    ``default()`` and ``validate()`` always see the fields the resource class declares."""
    meta = cls._meta
    if isinstance(meta, KindMeta):
        return [meta.version]
    if meta.converts:
        return [meta.storage_version.name]
    return [v.name for v in meta.versions if v.served]


def review(body: Any, hook: str, api: kube.ApiClient | None = None) -> Answer:
    """Answer one AdmissionReview with ``hook`` (``validate`` or ``mutate``)."""
    started = time.perf_counter()
    req = _request(body)
    cls = _resource_class(req)
    uid = req["uid"]
    obj, old = req.get("object"), req.get("oldObject")
    namespace = req.get("namespace") or ""
    name = req.get("name") or ((obj or old or {}).get("metadata") or {}).get("name", "")
    # Reads go to the api-server, not the cache: admission must see what was just written.
    request = AdmissionRequest(
        uid=uid, operation=req.get("operation", ""), namespace=namespace, name=name,
        dry_run=bool(req.get("dryRun")), user=(req.get("userInfo") or {}).get("username", ""),
        lister=Lister(api or kube.api_client(), {}))
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    message = ""
    try:
        if hook == MUTATE:
            patch = _mutate(cls, obj, request)
            if patch:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        else:
            _validate(cls, obj, old, request)
    except ValidationError as exc:
        message = str(exc)
        response.update(allowed=False, status=_denied(exc.message, exc.field))
    except Exception as exc:  # a bug in a hook denies this request; the server stays up
        log.exception("%s hook of %s failed", hook, cls.__name__)
        message = f"{hook} hook failed: {type(exc).__name__}: {exc}"
        response.update(allowed=False, status={"code": 500, "message": message})
    if request.warnings:
        response["warnings"] = [w[:500] for w in request.warnings]
    return Answer(
        response={"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "response": response},
        resource=cls._meta.crd_name, namespace=namespace, name=name,
        operation=request.operation, hook=hook, allowed=response["allowed"], message=message,
        dry_run=request.dry_run, seconds=time.perf_counter() - started)


def _request(body: Any) -> dict:
    if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
        raise BadReview("expected an AdmissionReview (admission.k8s.io/v1)")
    if body.get("apiVersion") != "admission.k8s.io/v1":
        raise BadReview(f"unsupported AdmissionReview version {body.get('apiVersion')!r}; "
                        "this server speaks admission.k8s.io/v1")
    req = body.get("request")
    if not isinstance(req, dict) or not req.get("uid"):
        raise BadReview("the AdmissionReview has no request with a uid")
    resource = req.get("resource")
    if not isinstance(resource, dict) or not resource.get("resource"):
        raise BadReview("the request names no resource")
    return req


def _resource_class(req: dict):
    resource = req["resource"]
    group = resource.get("group") or ""
    name = f"{resource['resource']}.{group}" if group else resource["resource"]
    for registry in (default_registry, webhook_registry):
        if name in registry:
            return registry.get(name)
    raise BadReview(f"no resource {name} is declared in this project")


def _mutate(cls, obj: dict | None, request: AdmissionRequest) -> list[dict]:
    if obj is None or request.operation == "DELETE" or not callable(getattr(cls, "default",
                                                                            None)):
        return []
    typed = cls(obj)
    typed.default(request)
    return json_patch(obj, typed.raw)


def _validate(cls, obj: dict | None, old: dict | None, request: AdmissionRequest) -> None:
    if request.operation == "DELETE":  # the object going is the old one; there is no new
        if old is None or not callable(getattr(cls, "validate_delete", None)):
            return
        warnings = cls(old).validate_delete(request)
    else:
        if obj is None or not callable(getattr(cls, "validate", None)):
            return
        warnings = cls(obj).validate(cls(old) if old else None, request)
    request.warnings.extend(warnings or [])


def _denied(message: str, field_path: str) -> dict:
    status: dict[str, Any] = {"code": 422, "reason": "Invalid", "message": message}
    if field_path:
        status["message"] = f"{field_path}: {message}"
        status["details"] = {"causes": [{"field": field_path, "message": message,
                                         "reason": "FieldValueInvalid"}]}
    return status


# --- conversion (ConversionReview, apiextensions.k8s.io/v1) ------------------------------------


def convert(body: Any) -> dict:
    """Answer one ConversionReview: every object to ``desiredAPIVersion``, through the hub
    (the storage version). A conversion function that fails fails the whole review with its
    message, as the api-server expects; a body that is not a ConversionReview raises
    ``BadReview``."""
    if not isinstance(body, dict) or body.get("kind") != "ConversionReview" \
            or body.get("apiVersion") != "apiextensions.k8s.io/v1":
        raise BadReview("expected a ConversionReview (apiextensions.k8s.io/v1)")
    req = body.get("request")
    if not isinstance(req, dict) or not req.get("uid") or not req.get("desiredAPIVersion"):
        raise BadReview("the ConversionReview has no request with a uid and desiredAPIVersion")
    desired = req["desiredAPIVersion"]
    response: dict[str, Any] = {"uid": req["uid"]}
    try:
        response["convertedObjects"] = [_convert_one(obj, desired)
                                        for obj in req.get("objects") or []]
        response["result"] = {"status": "Success"}
    except BadReview:
        raise
    except Exception as exc:
        log.exception("conversion to %s failed", desired)
        response["result"] = {"status": "Failure",
                              "message": f"conversion to {desired} failed: "
                                         f"{type(exc).__name__}: {exc}"}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": response}


def _convert_one(obj: dict, desired: str) -> dict:
    group, _, version = obj.get("apiVersion", "").rpartition("/")
    to_group, _, to_version = desired.rpartition("/")
    cls = next((r for r in default_registry
                if r._meta.group == group and r._meta.kind == obj.get("kind")), None)
    if cls is None or to_group != group:
        raise BadReview(f"no resource of kind {obj.get('kind')!r} in {group!r} is declared "
                        f"here (converting to {desired})")
    meta = cls._meta
    hub = meta.storage_version
    current = copy.deepcopy(obj)
    if version != hub.name:
        current = meta.version(version).to_hub(current)
        current["apiVersion"] = f"{group}/{hub.name}"
    if to_version != hub.name:
        current = meta.version(to_version).from_hub(current)
    current["apiVersion"] = desired
    current["metadata"] = obj["metadata"]  # the api-server refuses changed metadata
    return current


# --- JSONPatch (RFC 6902) of one document into another -----------------------------------------


def json_patch(before: Any, after: Any, path: str = "") -> list[dict]:
    """The operations that turn ``before`` into ``after``: objects key by key, anything else
    (lists included) replaced whole."""
    if isinstance(before, dict) and isinstance(after, dict):
        ops: list[dict] = []
        for key in before:
            if key not in after:
                ops.append({"op": "remove", "path": f"{path}/{_escape(key)}"})
        for key, value in after.items():
            if key not in before:
                ops.append({"op": "add", "path": f"{path}/{_escape(key)}",
                            "value": copy.deepcopy(value)})
            else:
                ops.extend(json_patch(before[key], value, f"{path}/{_escape(key)}"))
        return ops
    if before == after and type(before) is type(after):
        return []
    return [{"op": "replace", "path": path or "", "value": copy.deepcopy(after)}]


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")
