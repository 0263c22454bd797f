"""The official client's generated classes load when first used, not when a process starts.

Each test runs a fresh interpreter (this one imported the client long ago) against the real
api-server, and checks both halves of the promise: a watcher's start imports none of the
generated API and model modules, and every way user code reaches the client still works.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from django.conf import settings

GENERATED = ("kubernetes.client.models.v1_pod", "kubernetes.client.api.core_v1_api")


def _python(stack, code: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(stack.kubeconfig),
           "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_watcher_starts_and_calls_the_api_server_without_the_generated_classes(stack):
    out = _python(stack, f"""
        import sys, django
        django.setup()
        from reconcilers.management.commands import watch  # everything the watcher imports
        from reconcilers import kube
        print(kube.version(kube.api_client())["major"])
        print([m for m in {GENERATED!r} if m in sys.modules])
        print(sum(m.startswith("kubernetes.client.models.") for m in sys.modules))
    """)
    major, loaded, models = out.split("\n")[:3]
    assert major == "1"
    assert loaded == "[]"
    assert int(models) < 10  # of ~700


def test_user_code_reaches_every_part_of_the_client_as_usual(stack):
    out = _python(stack, """
        import django
        django.setup()
        from reconcilers import kube, kubeimport
        assert kubeimport.is_deferred("kubernetes.client")

        from kubernetes import client                       # the usual import
        namespaces = client.CoreV1Api(kube.api_client()).list_namespace()
        print(type(namespaces).__name__, any(n.metadata.name == "default"
                                             for n in namespaces.items))
        assert not kubeimport.is_deferred("kubernetes.client")

        import kubernetes
        print(kubernetes.__version__.count(".") >= 1, kubernetes.watch.Watch.__name__)
        from kubernetes.client import *                     # noqa: F403
        print(V1Pod.__name__, client.models.V1ConfigMap.__name__)  # noqa: F405
        from kubernetes.client.rest import ApiException
        print(issubclass(kube.ApiError, ApiException), issubclass(kube.ApiClient, client.ApiClient))
        from kubernetes.dynamic import DynamicClient
        cms = DynamicClient(kube.api_client()).resources.get(api_version="v1", kind="ConfigMap")
        print(cms.kind)
    """)
    assert out.split("\n")[:5] == ["V1NamespaceList True", "True Watch", "V1Pod V1ConfigMap",
                                   "True True", "ConfigMap"]


def test_threads_that_first_touch_the_client_together_all_get_it(stack):
    out = _python(stack, """
        import threading, django
        django.setup()
        from reconcilers import kube  # noqa: F401  (defers the client)
        import kubernetes.client as client
        got, start = [], threading.Barrier(8)

        def use():
            start.wait()
            got.append(client.CoreV1Api.__name__ + "/" + client.V1Pod.__name__)

        threads = [threading.Thread(target=use) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(sorted(set(got)), len(got))
    """)
    assert out.strip() == "['CoreV1Api/V1Pod'] 8"


def test_a_client_imported_before_the_framework_is_left_as_it_is(stack):
    out = _python(stack, """
        import kubernetes.client, django
        django.setup()
        from reconcilers import kube, kubeimport
        print(kubeimport.is_deferred("kubernetes.client"), "kubernetes.client.models.v1_pod"
              in __import__("sys").modules, kube.version(kube.api_client())["major"])
    """)
    assert out.strip() == "False True 1"


RARE = ("requests", "oauthlib", "requests_oauthlib")


def test_a_watcher_starts_without_the_libraries_of_the_clients_rare_paths(stack):
    out = _python(stack, f"""
        import sys, django
        django.setup()
        from reconcilers.management.commands import watch  # noqa: F401
        from reconcilers import kube
        print(kube.version(kube.api_client())["major"])
        print(sorted({{m.split(".")[0] for m in sys.modules}} & set({RARE!r})))
    """)
    assert out.split("\n")[:2] == ["1", "[]"]


def test_the_clients_rare_paths_still_reach_their_libraries(stack):
    out = _python(stack, """
        import django
        django.setup()
        from reconcilers import kube  # noqa: F401  (defers the libraries)
        from kubernetes.client import Configuration
        from kubernetes.client import rest
        from kubernetes.config import kube_config
        import urllib3

        # A proxy is used unless no_proxy names the host (requests' check).
        def manager(host):
            cfg = Configuration(host=host)
            cfg.proxy, cfg.no_proxy = "http://127.0.0.1:3128", "10.0.0.1"
            return type(rest.RESTClientObject(cfg).pool_manager).__name__
        print(manager("https://10.0.0.1:6443"), manager("https://10.0.0.2:6443"))

        # OIDC refresh: the session class and the error it catches are the real ones.
        session = kube_config.OAuth2Session(client_id="operator")
        print(type(session).__module__, session.client_id)
        from oauthlib.oauth2.rfc6749.errors import InvalidClientIdError
        print(kube_config.oauthlib.oauth2.rfc6749.errors.InvalidClientIdError
              is InvalidClientIdError)

        # Code that imports them itself gets them whole.
        import requests
        print(requests.utils.DEFAULT_PORTS["https"], requests.Session.__name__)
    """)
    assert out.split("\n")[:4] == ["PoolManager ProxyManager",
                                   "requests_oauthlib.oauth2_session operator", "True",
                                   "443 Session"]


def test_libraries_imported_before_the_framework_are_bound_as_they_are(stack):
    out = _python(stack, """
        import requests.utils, requests_oauthlib, django
        django.setup()
        from reconcilers import kube  # noqa: F401
        from kubernetes.client import rest
        from kubernetes.config import kube_config
        print(rest.should_bypass_proxies is requests.utils.should_bypass_proxies,
              kube_config.OAuth2Session is requests_oauthlib.OAuth2Session)
    """)
    assert out.strip() == "True True"
