"""Pure remediation: classify failure evidence, pick the next rung of the safety ladder, guard the steps."""
