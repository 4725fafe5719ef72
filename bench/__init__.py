"""Benchmarks of tfdeploy against Ansible, pdsh + rsync and a sequential fabric loop on the lab.

Run as root (the lab needs namespaces): `sudo /opt/tfdeploy/venv/bin/python -m bench`.
A script, not a test: it prints one markdown table (docs/performance.md); with `--out
docs/bench/main.md` it also writes it to the file the docs link.
"""
