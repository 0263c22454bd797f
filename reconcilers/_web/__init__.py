"""The web role: what the app serves of its own in the web process (``/healthz``, ``/readyz``,
``/metrics``, routed by ``urls``) and the check of it from inside its container (``health``)."""
