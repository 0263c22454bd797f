"""The kopf peer of the webhook latency figure (hack/webhook-latency.py): the sample Foo's two
admission webhooks written the kopf way, doing the same work as reconcilers' (the validating
one LISTs the namespace's Foos from the api-server; the mutating one defaults replicas).

Run as ``kopf run --standalone --all-namespaces webhooks.py`` with BENCH_WEBHOOK_PORT,
BENCH_WEBHOOK_CERT and BENCH_WEBHOOK_KEY (the same serving pair as ours); the configurations
are registered by the script, pointing at ``/validate`` and ``/mutate`` here, exactly as for
ours. kopf's defaults otherwise; no self-managed configuration.
"""

import os
import ssl

import aiohttp
import kopf

GROUP, VERSION, PLURAL = "samplecontroller.k8s.io", "v1alpha1", "foos"
_api: dict = {}


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_):
    settings.posting.enabled = False
    settings.admission.managed = None
    settings.admission.server = kopf.WebhookServer(
        addr="127.0.0.1", port=int(os.environ["BENCH_WEBHOOK_PORT"]), host="127.0.0.1",
        certfile=os.environ["BENCH_WEBHOOK_CERT"], pkeyfile=os.environ["BENCH_WEBHOOK_KEY"])
    info = kopf.login_with_kubeconfig(settings=settings)
    context = ssl.create_default_context(cafile=info.ca_path)
    _api["server"] = info.server.rstrip("/")
    _api["session"] = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context),
        headers={"Authorization": f"Bearer {info.token}"})


@kopf.on.validate(GROUP, VERSION, PLURAL, id="validate")
async def validate(body, namespace, name, **_):
    wanted = (body.get("spec") or {}).get("deploymentName")
    url = f"{_api['server']}/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    async with _api["session"].get(url) as response:
        items = (await response.json())["items"]
    for other in items:
        if other["metadata"]["name"] != name and other["spec"].get("deploymentName") == wanted:
            raise kopf.AdmissionError(f'Deployment "{wanted}" is already named by Foo '
                                      f'"{other["metadata"]["name"]}"', code=422)


@kopf.on.mutate(GROUP, VERSION, PLURAL, id="mutate")
def mutate(spec, patch, **_):
    if spec.get("replicas") is None:
        patch.spec["replicas"] = 1
