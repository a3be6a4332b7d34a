"""Pure builders: plan -> ``vllm serve`` argument list (and, later, Kubernetes objects)."""
