"""A Website: its content in a ConfigMap, a Deployment serving it once that exists, and a
Service in front once the Deployment is available - dependent resources, in order."""
