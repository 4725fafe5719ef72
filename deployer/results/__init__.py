"""What a run leaves to look at later: local run records, the log archive, runs found on the hosts
(`down`, `status`, `logs`), pulls and tunnels."""
