"""A local port forwarded to a port on a task's host, over the host's transport (`tunnel`).

TensorBoard and other dashboards listen on a host's loopback; opening them to the network
would need firewall and security-group changes. Here each local connection becomes one SSH
direct-tcpip channel (jump hosts included), and bytes are pumped both ways until both sides
have finished sending: a side's end of data is passed on as a half-close, so a client that
sends, then shuts its writing half, still gets its answer. Only this machine's loopback
listens. Waiting uses selectors (epoll), never select(), whose descriptors stop at 1024: each
connection holds three (its socket, and the channel's pipe).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

from deployer.config.plan import Plan
from deployer.config.roles import SIDECAR
from deployer.core.errors import HostError, UsageError
from deployer.hosts.fleet import Fleet
from deployer.hosts.transport import Stream, Transport

CHUNK = 64 * 1024


class Tunnel:
    """127.0.0.1:local_port here -> 127.0.0.1:remote_port on the transport's host."""

    def __init__(self, transport: Transport, remote_port: int, local_port: int = 0) -> None:
        self.transport = transport
        self.remote_port = remote_port
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._server.bind(("127.0.0.1", local_port))
        except OSError as exc:
            self._server.close()
            raise UsageError(f"local port {local_port} cannot be used: {exc.strerror}") from None
        self._server.listen(socket.SOMAXCONN)  # a page opening 100 connections at once
        self.local_port: int = self._server.getsockname()[1]
        self._closed = threading.Event()
        self.errors: list[str] = []  # what went wrong with connections, for the caller to show
        self._thread = threading.Thread(target=self._accept, name="tunnel", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}/"

    def start(self) -> Tunnel:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.close()

    def __enter__(self) -> Tunnel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            while not self._closed.is_set():
                try:
                    if not selector.select(0.2):
                        continue
                    client, _ = self._server.accept()
                except (OSError, ValueError):
                    return  # closed
                threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            remote = self.transport.open_port(self.remote_port)
        except HostError as exc:
            self.errors.append(exc.message)
            client.close()
            return
        except Exception as exc:  # a thread's failure must not print a traceback over the view
            self.errors.append(f"{type(exc).__name__}: {exc}")
            client.close()
            return
        try:
            _pump(client, remote, self._closed)
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            client.close()
            with contextlib.suppress(Exception):
                remote.close()


def allow_many_files() -> None:
    """Raises this process's open-file limit to its hard limit: each tunnelled connection holds
    three descriptors, and a soft limit of 1024 would refuse the 342nd connection."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def forward_sidecar(
    fleet: Fleet, plan: Plan, run_id: str, *, detached: bool
) -> tuple[Tunnel | None, str | None]:
    """[job.tensorboard] made reachable here: a tunnel to its port (the same local port when
    free), or nothing on this machine's own host, or for a detached run the command that
    forwards it later. Returns the tunnel (to close when `up` ends) and what to tell the user."""
    sidecar = next((t for t in plan.tasks if t.role == SIDECAR.name), None)
    if sidecar is None or sidecar.port is None:
        return None, None
    where = f"{sidecar.name}@{sidecar.host} port {sidecar.port}"
    if detached:
        later = f"tfdeploy tunnel {run_id} {sidecar.port} --task {sidecar.name}"
        return None, f"tensorboard: {where}; `{later}` forwards it here"
    member = fleet.member(sidecar.host)
    if member.host.transport == "local":  # this machine: its own port, nothing to forward
        return None, f"tensorboard: http://127.0.0.1:{sidecar.port}/ ({where})"
    try:
        tunnel = Tunnel(member.agent.transport, sidecar.port, sidecar.port).start()
    except UsageError:  # that port is taken here: any free one
        tunnel = Tunnel(member.agent.transport, sidecar.port).start()
    return tunnel, f"tensorboard: {tunnel.url} (forwarded to {where})"


def _pump(a: Stream, b: Stream, closed: threading.Event) -> None:
    """Copies bytes both ways until both sides have ended their sending (or one fails, or the
    tunnel closes); a side's end is passed on to the other as a half-close."""
    with selectors.DefaultSelector() as selector:
        selector.register(a.fileno(), selectors.EVENT_READ, (a, b))
        selector.register(b.fileno(), selectors.EVENT_READ, (b, a))
        while selector.get_map() and not closed.is_set():
            for key, _ in selector.select(0.5):
                source, sink = key.data
                try:
                    data = source.recv(CHUNK)
                except OSError:
                    return
                if not data:  # nothing more from this side; the other may still answer
                    selector.unregister(key.fd)
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_WR)
                    continue
                try:
                    sink.sendall(data)
                except OSError:
                    return
