"""What we know about each vLLM release: defaults, accepted flags, spelling of options."""
