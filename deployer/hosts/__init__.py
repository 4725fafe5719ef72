"""Reaching hosts: the transport interface (SSH, local), sessions, the agent client, the fleet of
members called in parallel, and what hosts report about their GPUs."""
