"""One `up`: the deployment that sequences preflight, network check, push, setup, start and
teardown, and the recovery that acts on failures."""
