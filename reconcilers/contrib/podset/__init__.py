"""The first talk's example, a ReplicaSet-like controller: a PodSet keeps N Pods matching its
selector, counting them from the shared cache, adopting orphans and deleting extras."""
