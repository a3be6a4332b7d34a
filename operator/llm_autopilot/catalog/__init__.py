"""Built-in facts: GPU products and popular models."""
