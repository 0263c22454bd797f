"""Admission and conversion webhooks: what a hook answers (``admission``), certificates,
configurations and routing (``webhooks``), and the HTTPS server (``server``)."""
