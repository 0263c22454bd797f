"""A hook on a built-in kind, for the webhook tests alone: its own app (installed by
``tests.webhook_settings``), so no other test's webhook server registers it."""
