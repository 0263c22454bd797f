"""Sample operators shipped with the framework, enabled by ``OPERATOR_SAMPLES=1``."""
