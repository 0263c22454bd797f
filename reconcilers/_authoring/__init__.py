"""What an author declares and what is made from it: the ``Reconciler`` base class
(``reconciler``), the registry ``@register`` fills (``registry``), dependent resources
(``dependents``), checks on typed references (``validation``), and the CRD and RBAC manifests
made from the declarations (``crds``, ``rbac``)."""
