"""One real SSH connection in a process of its own, so that the process's environment picks
paramiko's path (hosts/paramiko_tuning.py reads it once): moves bytes both ways through it and
prints, as JSON, the path taken and the classes that carried the bytes.

`python -m tests.support.paramiko_probe '{"name": ..., "address": ..., "settings": {...}}'`
"""

from __future__ import annotations

import json
import sys

from deployer.hosts import paramiko_tuning
from deployer.hosts.ssh_transport import SSHTransport
from tests.support.transport import endpoint

SEQ = 300_000  # `seq` prints ~2 MB: many packets through the channel buffer
UPLOAD = bytes(range(256)) * 4096  # 1 MiB, every byte value


def _name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def main(spec: dict[str, object]) -> dict[str, object]:
    settings = spec["settings"]
    assert isinstance(settings, dict)
    t = SSHTransport(endpoint(str(spec["name"]), str(spec["address"]), **settings))
    try:
        down = t.run(["seq", "1", str(SEQ)]).stdout
        path = f"/tmp/tfdeploy-probe-{spec['tag']}"
        t.put(UPLOAD, path)
        back = t.run(["sh", "-c", 'cat "$1"; rm -f "$1"', "sh", path]).stdout
        session = t.open_session(["cat"])
        conn = t._hops[-1].client.get_transport()
        found = {
            "path": paramiko_tuning.PATH,
            "why": paramiko_tuning.WHY,
            "transport": _name(conn),
            "packetizer": _name(conn.packetizer),
            "socket": _name(conn.sock),
            "channel_buffer": _name(session._chan.in_buffer),
            "down_ok": down == "".join(f"{i}\n" for i in range(1, SEQ + 1)).encode(),
            "up_ok": back == UPLOAD,
        }
        session.close()
        return found
    finally:
        t.close()


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
