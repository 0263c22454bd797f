"""This project's own migrations (the ``operator_project`` app); the framework's are in the app."""
