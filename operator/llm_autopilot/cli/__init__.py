"""Shell: the ``llm-autopilot`` command line."""
