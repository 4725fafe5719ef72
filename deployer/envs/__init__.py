"""The job's Python environment on the controller: its inputs, the hosts' target platforms, and
the wheels resolved for them (docs/environments.md)."""
