"""A test operator whose behaviour each object's spec scripts (sleep, fail, requeue)."""
