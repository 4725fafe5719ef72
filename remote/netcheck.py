"""Can every TF connection be made? Stand-in listeners on the planned ports, and probes to peers.

A security group that lets SSH through but drops the TF ports is the most common way a fleet
job fails, and TensorFlow only says so after a long collective timeout. Before anything starts,
each host listens on its planned TF ports (`listen`: the TF servers are not running yet), every
host connects to the destinations TF will connect to (`probe`), and the listeners go (`close`).

The listener is a detached process holding sockets the op bound itself, so a bind error is the
op's answer; it accepts and drops connections until `close` or its own deadline, and a hello's
listener also ends with the agent process serving that hello's session, so a controller that
dies or is interrupted mid-check leaves no listening port behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import daemon
import layout
import params
import procs
import protocol

# A controller that dies mid-check leaves stand-ins for at most this long. It asks for what its
# probes may take (protocol.probe_budget), which at 1,000 hosts probed in full is minutes.
MAX_LISTEN_S = 600.0
OWNER_CHECK_S = 1.0  # how often a stand-in looks whether the agent that started it still runs
# Every prober of a large job may dial one port (the chief's) within a few milliseconds; a short
# accept queue would drop SYNs, each costing a retransmission second (the kernel caps it at
# net.core.somaxconn).
BACKLOG = 4096
T = TypeVar("T")
_NO_ROUTE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN}


def op_netcheck(req: dict[str, Any]) -> protocol.NetcheckReply:
    action = params.param(req, "action", str)
    run_id = params.check_name(params.param(req, "run_id", str), "run id")
    record = layout.netcheck_record(req, run_id)
    if action == protocol.NETCHECK_LISTEN:
        return {"pid": listen_as_asked(record, req)}
    if action == protocol.NETCHECK_PROBE:
        targets = params.param(req, "targets", list)
        timeout = float(params.param(req, "wait", (int, float), 3.0))
        return {"results": probe([_target(t) for t in targets], timeout)}
    if action == protocol.NETCHECK_CLOSE:
        return {"closed": close(record)}
    raise params.AgentError(f"netcheck action must be listen, probe or close, not {action!r}")


def listen_as_asked(record: Path, req: dict[str, Any], *, owned: bool = False) -> int:
    """`listen` with the request's `ports` and `seconds` (the netcheck op's, or the `listen`
    table of a hello). `owned` (a hello's): the stand-ins also end with this agent process,
    the session a hello opens and the controller keeps for the whole check; a netcheck op may
    be a one-shot process that ends at once, so its stand-ins keep only their deadline."""
    ports = params.param(req, "ports", list)
    seconds = min(float(params.param(req, "seconds", (int, float), 30.0)), MAX_LISTEN_S)
    return listen(record, [_port(p) for p in ports], seconds, owned=owned)


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise params.AgentError(f"ports must be TCP port numbers (1-65535), got {value!r:.40}")
    return value


def _target(value: Any) -> tuple[str, int]:
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)):
        raise params.AgentError(f"a probe target is [address, port], not {value!r:.60}")
    return value[0], _port(value[1])


# ---- listening --------------------------------------------------------------------------------


def listen(record: Path, ports: list[int], seconds: float, *, owned: bool = False) -> int:
    """Binds `ports` as TF would (every address), then leaves them to a detached listener."""
    close(record)  # a check of this run that was interrupted before its close
    sockets = []
    try:
        for port in ports:
            sockets.append(_bound(port))
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise params.AgentError(f"cannot listen on TF port {port}: {exc.strerror}") from None
    deadline = time.monotonic() + seconds
    # Owned: the agent process answering this hello serves the controller's session for the
    # whole check; once it is gone (the controller interrupted during preflight, or dead),
    # nobody will probe or close these, and they end within OWNER_CHECK_S, not at the deadline.
    owner = (os.getpid(), procs.start_ticks(os.getpid())) if owned else None
    pid = daemon.spawn(record, lambda: _serve(sockets, deadline, owner))
    for sock in sockets:
        sock.close()
    return pid


def _bound(port: int) -> socket.socket:
    """The wildcard address, IPv6 with IPv4 mapped where the host has IPv6, like a TF server."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address: tuple[Any, ...] = ("::", port)
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address = ("0.0.0.0", port)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _serve(sockets: list[socket.socket], deadline: float, owner: tuple[int, Any] | None) -> None:
    """Accepts connections until SIGTERM, the deadline or the end of the agent process that
    started it (`owner`: pid and start ticks); each connection is closed once its prober has
    closed it (EOF), so TIME_WAIT stays on the prober's side, never on the TF port. A selector
    (epoll), not select(): hundreds of probers may be connected at once, past select's 1,024.
    SIGTERM ends the wait at once: the request that stops the check (the push's first, a
    release) waits until these ports are free."""
    daemon.stop_on_sigterm()
    _raise_open_files()
    listening = set(sockets)
    with selectors.DefaultSelector() as selector:
        try:
            for sock in sockets:
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ)
            while time.monotonic() < deadline and (owner is None or procs.process_alive(*owner)):
                wait = min(OWNER_CHECK_S, max(0.0, deadline - time.monotonic()))
                for key, _ in selector.select(wait):
                    ready = key.fileobj
                    assert isinstance(ready, socket.socket)
                    if ready in listening:
                        _accept(selector, ready)
                    else:
                        selector.unregister(ready)
                        ready.close()
        except daemon.Stopped:
            pass
        finally:
            for key in list(selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]


def _raise_open_files() -> None:
    """The soft limit on open files is often 1,024; a stand-in may hold one per prober."""
    with contextlib.suppress(ValueError, OSError):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _accept(selector: selectors.BaseSelector, listening: socket.socket) -> None:
    """Takes every connection waiting, so a burst empties the accept queue in one wake-up."""
    while True:
        try:
            conn, _ = listening.accept()
        except OSError:  # BlockingIOError once the queue is empty; ECONNABORTED and the like
            return
        selector.register(conn, selectors.EVENT_READ)


def close(record: Path) -> bool:
    """Stops this run's listener (if any) and waits until its ports are free again."""
    return daemon.stop(record)


# ---- probing ----------------------------------------------------------------------------------


def probe(targets: list[tuple[str, int]], timeout: float) -> list[str]:
    """One verdict per target, in order: ok, refused, timed out, no route, ...

    At most protocol.PROBE_WORKERS connects are in flight, each with its own `timeout` from the
    moment it starts: a target waiting in the queue is not timing out meanwhile, so a long list
    is slower, never falsely blocked. What timed out is tried once more after the first pass: a
    SYN lost in a burst of first contacts (ARP, a busy softirq, a full accept queue) is not a
    firewall. A real drop costs two timeouts; the whole op at most protocol.probe_budget.
    """
    results = _bounded_map(lambda t: connect(t, timeout), targets)
    again = [i for i, said in enumerate(results) if said == protocol.PROBE_TIMED_OUT]
    retried = _bounded_map(lambda i: connect(targets[i], timeout), again)
    for i, said in zip(again, retried):
        results[i] = said
    return results


def _bounded_map(fn: Callable[[T], str], items: list[T]) -> list[str]:
    """`fn` of each item, PROBE_WORKERS threads at a time, in order: ThreadPoolExecutor.map
    without concurrent.futures, whose imports (logging among them) were a third of this
    module's, paid by every hello that starts stand-ins."""
    results = [""] * len(items)
    failed: list[BaseException] = []
    todo = iter(range(len(items)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # re-raised in the caller, as map() would
                failed.append(exc)
                return

    threads = [
        threading.Thread(target=work) for _ in range(min(protocol.PROBE_WORKERS, len(items)))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]
    return results


def connect(target: tuple[str, int], timeout: float) -> str:
    address, port = target
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except socket.gaierror as exc:
        return f"{protocol.PROBE_UNRESOLVED}: {exc.strerror}"
    except socket.timeout:
        return protocol.PROBE_TIMED_OUT
    except ConnectionRefusedError:
        return protocol.PROBE_REFUSED
    except OSError as exc:
        if exc.errno in _NO_ROUTE:
            return protocol.PROBE_NO_ROUTE
        return exc.strerror or str(exc)
    sock.close()
    return protocol.PROBE_OK
