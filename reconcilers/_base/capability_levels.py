"""The five Operator SDK capability levels, their criteria, and which ones we can observe.

Source: Operator SDK documentation, "Operator Capability Levels" (the OLM CSV annotation uses
these names). A criterion with an ``evidence`` id is scored from the ledger and history by
``evidence.py``; the others can only be claimed by the operator's author.

What a run cannot show by itself - an operand upgrade, a backup, a fail-over, a scaling or
tuning decision - the reconciler reports when its code path actually does it
(``ctx.capability("backup", "snapshot 2026-12-03 to s3://...")``); one reported and successful
run is the evidence, and the admin links it. A finalizer or a re-run after a child changed
proves much less, and counts for less: neither lifts a level on its own.
"""

# What ``ctx.capability(action)`` accepts, and the criterion each action evidences.
ACTIONS = {
    "upgrade": "upgrade",
    "backup": "lifecycle",
    "restore": "lifecycle",
    "failover": "lifecycle",
    "failback": "lifecycle",
    "scale-members": "lifecycle",
    "auto-scaling": "autopilot",
    "auto-tuning": "autopilot",
}

LEVELS = [
    (1, "Basic Install",
     "Provisions and configures the operand from spec, waits for it to be healthy and reports "
     "readiness in status.",
     [
         ("reconciled", "Reconciles objects of its kind to success", "success"),
         ("observed-generation", "Writes status with observedGeneration matching the spec it "
                                 "acted on", "observed_generation"),
         ("conditions", "Reports readiness through status conditions", "conditions"),
     ]),
    (2, "Seamless Upgrades",
     "Upgrades the operand (and older operand versions) by a spec change; the operator itself "
     "upgrades seamlessly; says in status when a version is unsupported.",
     [
         ("spec-change", "Acts on a changed spec (a successful run at generation > 1)",
          "spec_change"),
         ("operand-upgrade", "Upgrades the operand to a new version by a spec change "
                             "(a successful run that reported ctx.capability(\"upgrade\", "
                             "detail) and changed a child while at it)", "upgrade"),
         ("unsupported-version", "Reports an unsupported version in status", None),
     ]),
    (3, "Full Lifecycle",
     "Backup and restore, complex reconfiguration, fail-over and fail-back, adding and removing "
     "members, application-aware scaling, operand resilience.",
     [
         ("finalizer-cleanup", "Cleans up through a finalizer before deletion completes",
          "finalizer"),
         ("recovers", "Recovers after errors (a failed run followed by a success for the same "
                      "object)", "recovered"),
         ("lifecycle", "Runs a lifecycle action - backup, restore, fail-over, fail-back or "
                       "adding/removing members (a successful run that reported it with "
                       "ctx.capability and changed a child while at it)", "lifecycle"),
     ]),
    (4, "Deep Insights",
     "Metrics about the operator's own health, operand metrics, alerts, custom Kubernetes Events, "
     "RED metrics.",
     [
         ("events", "Emits custom Kubernetes Events (from a successful run)", "events"),
         ("metrics", "Exposes metrics of its own about the operand or its health: a scrape of "
                     "/metrics served a family the reconciler declares in `metrics` (the "
                     "framework's own series come with every operator)", "metrics_scraped"),
         ("alerts", "Ships alerts", None),
     ]),
    (5, "Auto Pilot",
     "Auto-scaling, auto-healing, auto-tuning, abnormality detection.",
     [
         ("auto-healing", "Heals the operand: a child that was changed or deleted is put "
                          "back (a successful run triggered by the child that wrote it)",
          "auto_healing"),
         ("autopilot", "Scales or tunes the operand from what it observed (a successful run "
                       "that reported ctx.capability(\"auto-scaling\") or "
                       "(\"auto-tuning\") and changed a child while at it)", "autopilot"),
     ]),
]


def as_rows() -> list[dict]:
    return [
        {"level": level, "name": name, "summary": summary,
         "criteria": [{"id": cid, "text": text, "evidence": evidence}
                      for cid, text, evidence in criteria]}
        for level, name, summary, criteria in LEVELS
    ]
