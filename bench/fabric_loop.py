"""A naive sequential fabric script, the floor of the comparison (run as its own process)."""

from __future__ import annotations

import sys

import paramiko
from fabric import Connection


def main(argv: list[str]) -> int:
    action, key, known_hosts, dest, pattern, tarball, *hosts = argv
    for spec in hosts:
        address, port = spec.rsplit(":", 1)
        c = Connection(
            address,
            user="root",
            port=int(port),
            connect_kwargs={"key_filename": key, "look_for_keys": False, "allow_agent": False},
        )
        c.client.load_host_keys(known_hosts)
        c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if action == "deploy":
            c.run(f"mkdir -p {dest}/code", hide=True)
            c.put(tarball, f"{dest}/code.tar")
            c.run(f"tar xf {dest}/code.tar -C {dest}/code", hide=True)
            start = f"cd {dest}/code && (setsid sleep 1000.3 >/dev/null 2>&1 </dev/null &)"
            wait = (
                f"i=0; until pgrep -f '{pattern}' >/dev/null; "
                "do i=$((i+1)); [ $i -lt 1000 ] || exit 9; sleep 0.02; done"
            )
            c.run(f"{start} && {wait}", hide=True)
        else:
            gone = f"while pgrep -f '{pattern}' >/dev/null; do sleep 0.02; done"
            c.run(f"pkill -f '{pattern}'; {gone}", hide=True)
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
