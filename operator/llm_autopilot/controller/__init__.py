"""Shell: the Kopf operator (handlers, Kubernetes I/O, admission webhook)."""
