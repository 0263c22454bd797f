"""kubernetes/sample-controller's ``Foo``, ported: a Foo owns the Deployment it names."""
