"""The five Operator SDK capability levels, their criteria, and which ones we can observe.

Source: Operator SDK documentation, "Operator Capability Levels" (the OLM CSV annotation uses
these names). A criterion with an ``evidence`` id is scored from the ledger and history by
``capabilities.py``; the others can only be claimed by the operator's author.
"""

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
         ("operand-upgrade", "Upgrades the operand to a new version by a spec change", None),
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
         ("backup-restore", "Backup and restore of the operand", None),
         ("failover", "Fail-over and fail-back", None),
     ]),
    (4, "Deep Insights",
     "Metrics about the operator's own health, operand metrics, alerts, custom Kubernetes Events, "
     "RED metrics.",
     [
         ("events", "Emits custom Kubernetes Events", "events"),
         ("metrics", "Exposes metrics about its health: a scrape of /metrics served this "
                     "reconciler's reconcile counts", "metrics_scraped"),
         ("alerts", "Ships alerts", None),
     ]),
    (5, "Auto Pilot",
     "Auto-scaling, auto-healing, auto-tuning, abnormality detection.",
     [
         ("auto-healing", "Heals the operand: a changed or deleted child is put back (a "
                          "successful owned-child run)", "auto_healing"),
         ("auto-scaling", "Scales the operand from observed load", None),
         ("auto-tuning", "Tunes the operand from observed behaviour", None),
     ]),
]


def as_rows() -> list[dict]:
    return [
        {"level": level, "name": name, "summary": summary,
         "criteria": [{"id": cid, "text": text, "evidence": evidence}
                      for cid, text, evidence in criteria]}
        for level, name, summary, criteria in LEVELS
    ]
