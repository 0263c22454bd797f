"""Admission and conversion webhooks: what a hook answers (``admission``), one request's answer
(``routes``), each call's record (``calls``), the serving pair (``certificates``), what the
api-server is told (``registration``), the HTTPS server (``server``), and the server's
lifecycle and ``manage.py webhook``'s actions (``lifecycle``)."""
