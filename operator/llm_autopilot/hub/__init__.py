"""Shell: reading model configs from the Hugging Face Hub or local folders (network and disk I/O)."""
