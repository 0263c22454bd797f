"""Write an OLM bundle: the ClusterServiceVersion claiming the capability level the runs evidence.

``bundle/manifests`` holds the CSV (deploy/'s Deployments, the generated RBAC, the CRDs it
owns), the CRDs and deploy/'s plain objects; ``bundle/metadata/annotations.yaml`` the package
and its channels. The CSV's ``capabilities`` is the highest level every reconciler's runs
evidence (the admin's "evidenced level"). ``--claim-level N`` asks for another; one the evidence
does not reach is refused with the admin's reason, unless ``--force``, which writes the reason
into the CSV too (docs/running/bundle.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings as django_settings
from django.core.management.base import BaseCommand, CommandError

from reconcilers._authoring import bundle, deploydir
from reconcilers._authoring.registry import registry
from reconcilers._base.conf import settings
from reconcilers._run import evidence


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser) -> None:
        parser.add_argument("app_labels", nargs="*", metavar="app_label",
                            help="only the reconcilers of these apps (default: all)")
        parser.add_argument("--output", type=Path, default=Path("bundle"),
                            help="the bundle's directory (default: bundle)")
        parser.add_argument("--deploy", type=Path, default=None,
                            help="the kustomization whose Deployments the CSV installs "
                                 "(default: the project's deploy/)")
        parser.add_argument("--package", default="django-crd-operator",
                            help="the OLM package (default: django-crd-operator)")
        parser.add_argument("--bundle-version", default=None,
                            help="the CSV's version (default: deploy/'s image tag)")
        parser.add_argument("--channel", action="append", default=None,
                            help="a channel (repeat for more; default: alpha)")
        parser.add_argument("--default-channel", default=None, help="default: the first channel")
        parser.add_argument("--image", default=None,
                            help="the operator's image (default: deploy/'s kustomization's)")
        parser.add_argument("--display-name", default=None)
        parser.add_argument("--description", default=None)
        parser.add_argument("--provider", default=None,
                            help="the publisher's name (OperatorHub requires one)")
        parser.add_argument("--claim-level", type=int, default=None, choices=range(1, 6),
                            metavar="{1-5}", help="the level to claim (default: the evidenced one)")
        parser.add_argument("--force", action="store_true",
                            help="claim --claim-level even where the evidence falls short")

    def handle(self, *args, app_labels: list[str], output: Path, deploy: Path | None,
               claim_level: int | None, force: bool, channel: list[str] | None,
               **options) -> None:
        if force and claim_level is None:
            raise CommandError("--force needs --claim-level: it lets a claim go beyond the "
                               "evidence, and there is no claim to force")
        deploy = deploy or Path(getattr(django_settings, "BASE_DIR", ".")) / "deploy"
        channels = tuple(channel or ["alpha"])
        try:
            classes = bundle.of_apps(registry, app_labels)
            level, evidenced, reasons = evidence.claimable([c.name() for c in classes],
                                                           claim_level)
            if classes and reasons and not force:
                raise CommandError(_refusal(level, evidenced, reasons, claim_level is None))
            made = bundle.build(classes, deploy, bundle.Options(
                package=options["package"], channels=channels,
                version=options["bundle_version"] or deploydir.default_version(deploy),
                default_channel=options["default_channel"] or channels[0],
                claim=bundle.LevelClaim(level, evidenced, tuple(reasons)), image=options["image"],
                display_name=options["display_name"], description=options["description"],
                provider=options["provider"]), settings().namespace_list)
            written = bundle.write(made, output)
        except bundle.BundleError as exc:
            raise CommandError(str(exc)) from exc
        for note in made.left_out:
            self.stderr.write(f"left out {note}")
        for warning in made.warnings:
            self.stderr.write(f"warning: {warning}")
        if reasons:
            self.stderr.write(f"claiming level {level} beyond the evidence (evidenced: "
                              f"{evidenced}), as --force asked; the CSV says so in "
                              f"{bundle.UNEVIDENCED_ANNOTATION}:\n  " + "\n  ".join(reasons))
        for path in written:
            self.stdout.write(f"Wrote {os.path.relpath(path)}")
        self.stdout.write(f"capabilities: {bundle.LEVEL_NAMES[level]} (level {level}; "
                          f"evidenced: {evidenced})")


def _refusal(level: int, evidenced: int, reasons: list[str], by_default: bool) -> str:
    asked = "the least a CSV can claim" if by_default else "as asked"
    lower = f"claim --claim-level {evidenced}, " if evidenced else ""
    return (f"the evidence does not reach level {level} ({bundle.LEVEL_NAMES[level]}, {asked}); "
            f"the evidenced level is {evidenced}:\n  " + "\n  ".join(reasons)
            + "\nRun the operator until its runs show it (the admin's Reconcilers page lists "
              f"what is missing), {lower}or add --claim-level {level} --force to claim it "
              "anyway (the CSV then says it is not evidenced)")
