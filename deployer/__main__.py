"""Lets `python -m deployer` work like the `tfdeploy` script (tests use it)."""

from deployer.cli.main import main

main()
