"""TF port firewall of one run: nftables (else iptables) rules tagged with the run id.

TensorFlow's gRPC servers bind the wildcard address and authenticate nobody, so while a run is up
its TF ports accept TCP only from the cluster's own addresses (and loopback). Everything a rule
contains is validated here (ports as integers, addresses parsed by `ipaddress`), so no request
text ever reaches nft's parser or an iptables argv unchecked.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import socket
import subprocess
from typing import Any

import params
import protocol

BACKENDS = ("nft", "iptables")
TOOL_TIMEOUT = 20.0
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"  # a non-root login's PATH often lacks these


def tag(run_id: str) -> str:
    """The nft table / iptables chain of a run: short, fixed alphabet, derived from the run id."""
    return "tfdeploy_" + hashlib.sha256(run_id.encode()).hexdigest()[:16]


def comment(run_id: str) -> str:
    return f"tfdeploy run {run_id}"[:120]


def _which(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SBIN}")


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=TOOL_TIMEOUT
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 126, "", str(exc))


def _last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {result.returncode}"


class _Tool:
    """One backend on this host, with the sudo prefix needed to use it (none as root)."""

    def __init__(self, backend: str, prefix: list[str]) -> None:
        self.backend = backend
        self.prefix = prefix
        self.nft = _which("nft")
        self.ipt = {4: _which("iptables"), 6: _which("ip6tables")}

    def call(self, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return _run([*self.prefix, *argv], stdin)


def _prefix() -> list[str] | None:
    """[] as root; ["sudo", "-n"] when sudo works without a password; None: no privilege."""
    if os.geteuid() == 0:
        return []
    sudo = _which("sudo")
    if sudo and _run([sudo, "-n", "true"]).returncode == 0:
        return [sudo, "-n"]
    return None


def probe(backend: str | None) -> tuple[_Tool | None, str | None]:
    """The usable backend, or None and a sentence saying what is missing."""
    choices = [backend] if backend else list(BACKENDS)
    found = [b for b in choices if _which("nft" if b == "nft" else "iptables")]
    if not found:
        return None, (
            f"no firewall tool: {' or '.join('nft' if b == 'nft' else 'iptables' for b in choices)}"
            " not found (install nftables or iptables, or set job.firewall = false and use"
            " security groups)"
        )
    prefix = _prefix()
    if prefix is None:
        return None, (
            f"changing firewall rules needs root: user {_user()} is not root and `sudo -n` "
            "is not allowed (grant passwordless sudo for nft/iptables, or set job.firewall = false)"
        )
    tool = _Tool(found[0], prefix)
    listing = (
        tool.call([tool.nft or "nft", "list", "tables"])
        if tool.backend == "nft"
        else tool.call([tool.ipt[4] or "iptables", "-w", "-S", "INPUT"])
    )
    if listing.returncode != 0:
        return None, f"{tool.backend} does not work for user {_user()}: {_last_line(listing)}"
    return tool, None


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())


def resolve(names: list[Any]) -> tuple[list[str], list[str]]:
    """Addresses (IPv4, IPv6) of the cluster's tf_addresses, as this host resolves them."""
    v4: set[str] = set()
    v6: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name or len(name) > 253 or "\0" in name:
            raise params.AgentError(f"allowed address {name!r:.80} is not an address or host name")
        try:
            found = [ipaddress.ip_address(name)]
        except ValueError:
            try:
                infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
            except (OSError, UnicodeError) as exc:
                raise params.AgentError(f"cannot resolve cluster address {name!r}: {exc}") from None
            found = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
        for addr in found:
            (v4 if addr.version == 4 else v6).add(str(addr))
    return sorted(v4), sorted(v6)


def nft_script(run_id: str, ports: list[int], v4: list[str], v6: list[str]) -> str:
    """One atomic nft transaction replacing the run's table (repeating `add` is harmless)."""
    table, note = tag(run_id), comment(run_id)
    dports = ", ".join(str(p) for p in ports)
    rules = ['iifname "lo" accept']
    if v4:
        rules.append(f"tcp dport {{ {dports} }} ip saddr {{ {', '.join(v4)} }} accept")
    if v6:
        rules.append(f"tcp dport {{ {dports} }} ip6 saddr {{ {', '.join(v6)} }} accept")
    rules.append(f'tcp dport {{ {dports} }} counter drop comment "{note}"')
    body = "\n".join(f"    {r}" for r in rules)
    return (
        f"add table inet {table}\n"
        f"delete table inet {table}\n"
        f"table inet {table} {{\n"
        f"  chain input {{\n"
        f"    type filter hook input priority -1; policy accept;\n"
        f"{body}\n"
        f"  }}\n"
        f"}}\n"
    )


def _ipt_add(tool: _Tool, run_id: str, ports: list[int], v4: list[str], v6: list[str]) -> None:
    chain = tag(run_id)[:28]
    for version, allowed in ((4, v4), (6, v6)):
        exe = tool.ipt[version]
        if exe is None:
            if version == 4:
                raise params.AgentError("iptables was not found")
            continue  # no IPv6 tooling on this host: nothing to filter there either
        steps = [["-N", chain], ["-A", chain, "-i", "lo", "-j", "RETURN"]]
        steps += [["-A", chain, "-s", a, "-j", "RETURN"] for a in allowed]
        steps.append(["-A", chain, "-j", "DROP"])
        for start in range(0, len(ports), 15):  # multiport takes at most 15 ports
            group = ",".join(str(p) for p in ports[start : start + 15])
            match = ["-p", "tcp", "-m", "multiport", "--dports", group]
            note = ["-m", "comment", "--comment", comment(run_id)]
            steps.append(["-I", "INPUT", *match, *note, "-j", chain])
        for step in steps:
            result = tool.call([exe, "-w", *step])
            if result.returncode != 0:
                raise params.AgentError(f"{os.path.basename(exe)} failed: {_last_line(result)}")


def _ipt_remove(tool: _Tool, run_id: str) -> int:
    chain = tag(run_id)[:28]
    removed = 0
    for exe in tool.ipt.values():
        if exe is None:
            continue
        listing = tool.call([exe, "-w", "-S", "INPUT"]).stdout.splitlines()
        rules = [line for line in listing if line.startswith("-A INPUT ")]  # rule i is number i+1
        numbers = [i + 1 for i, line in enumerate(rules) if line.split()[-2:] == ["-j", chain]]
        for number in reversed(numbers):  # from the bottom up, so the numbers stay valid
            if tool.call([exe, "-w", "-D", "INPUT", str(number)]).returncode == 0:
                removed += 1
        if tool.call([exe, "-w", "-F", chain]).returncode == 0:
            tool.call([exe, "-w", "-X", chain])
            removed += 1
    return removed


def op_firewall(req: dict[str, Any]) -> protocol.FirewallReply:
    action = params.param(req, "action", str)
    backend = params.param(req, "backend", str, None)
    if backend is not None and backend not in BACKENDS:
        raise params.AgentError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if action == protocol.FIREWALL_CHECK:
        tool, problem = probe(backend)
        return {"backend": tool.backend if tool else None, "problem": problem}
    run_id = params.check_name(params.param(req, "run_id", str), "run id")
    if action == protocol.FIREWALL_ADD:
        return _add(req, run_id, backend)
    if action == protocol.FIREWALL_REMOVE:
        return _remove(run_id, backend)
    if action == protocol.FIREWALL_LIST:
        tool, problem = probe(backend)
        if tool is None:
            raise params.AgentError(problem or "no firewall tool")
        return {"rules": _list(tool, run_id)}
    raise params.AgentError(f"firewall action must be add, remove, check or list, not {action!r}")


def _add(req: dict[str, Any], run_id: str, backend: str | None) -> protocol.FirewallRulesReply:
    ports = sorted(set(params.param(req, "ports", list)))
    for port in ports:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise params.AgentError(f"ports must be TCP port numbers (1-65535), got {port!r:.40}")
    v4, v6 = resolve(params.param(req, "allowed", list))
    if not ports:
        return {"backend": None, "rules": []}
    tool, problem = probe(backend)
    if tool is None:
        raise params.AgentError(problem or "no firewall tool")
    if tool.backend == "nft":
        result = tool.call([tool.nft or "nft", "-f", "-"], nft_script(run_id, ports, v4, v6))
        if result.returncode != 0:
            raise params.AgentError(f"nft refused the rules: {_last_line(result)}")
    else:
        _ipt_remove(tool, run_id)  # a repeated add replaces, like nft's
        try:
            _ipt_add(tool, run_id, ports, v4, v6)
        except params.AgentError:
            _ipt_remove(tool, run_id)
            raise
    return {"backend": tool.backend, "rules": _list(tool, run_id)}


def _remove(run_id: str, backend: str | None) -> protocol.FirewallRemoveReply:
    """Idempotent: removes the run's rules from every backend present; 0 when there were none."""
    removed = 0
    for name in [backend] if backend else list(BACKENDS):
        tool, _ = probe(name)
        if tool is None:
            continue
        if name == "nft":
            if tool.call([tool.nft or "nft", "list", "table", "inet", tag(run_id)]).returncode == 0:
                result = tool.call([tool.nft or "nft", "delete", "table", "inet", tag(run_id)])
                if result.returncode != 0:
                    raise params.AgentError(f"nft could not delete the rules: {_last_line(result)}")
                removed += 1
        else:
            removed += _ipt_remove(tool, run_id)
    return {"removed": removed}


def _list(tool: _Tool, run_id: str) -> list[str]:
    """The run's rules as the tool prints them (for tests and for people)."""
    if tool.backend == "nft":
        result = tool.call([tool.nft or "nft", "list", "table", "inet", tag(run_id)])
        return result.stdout.splitlines() if result.returncode == 0 else []
    lines = []
    chain = tag(run_id)[:28]
    for exe in tool.ipt.values():
        if exe is not None:
            listing = tool.call([exe, "-w", "-S"]).stdout.splitlines()
            lines += [line for line in listing if chain in line]
    return lines
