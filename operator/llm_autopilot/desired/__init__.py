"""The reconcile's desired state, decided without I/O from what one gather step read (controller/gather.py).

Pure: it imports the layers below it (planner, render, remediation, api) and never a shell."""
