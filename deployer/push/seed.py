"""The fan-out's uplink copy: every content streamed once, into the chain's first host (its seed).

On a first deploy (the seed's hello says its store is empty) the stream begins during
preflight, as soon as that host is greeted and its own checks pass, while the controller's
uplink would otherwise idle: greeting and checking the other hosts, the network check and the
chain's listeners take a second or more on a fleet. The seed stores what arrives; once the
chain is set up, `onward` names the host it forwards to, and the seed replays what it already
has to it before forwarding the rest as it comes (remote/peers.py). A preflight that fails, or
Ctrl-C, cancels the stream: a content arrived in part is never published, and what did arrive
is a cache the next push does not send again. Nothing is started anywhere.

A fan-out without such a head start uses the same stream with its next host known from the
start.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Sequence
from typing import Any

from deployer.core.errors import HostError
from deployer.hosts.fleet import Member, Pending
from deployer.push.sync import CodeFile, Manifest, send_contents
from remote import protocol

ONWARD_WAIT_S = 600.0  # how long a seed that has stored everything waits to be told where to
CANCEL_WAIT_S = 5.0  # a cancelled stream's thread is given this long to let go of its session


class SeedStream:
    """One stream of `contents` into `member`'s store, on a session of its own, in a thread.

    `hop` is where the seed forwards every piece; None: the seed stores only, until `onward`.
    `secret`: the chain's, which the seed proves to the next host (None: a new one).
    """

    def __init__(
        self,
        member: Member,
        manifest: Manifest,
        contents: Sequence[CodeFile],
        run_id: str,
        hop: tuple[str, int] | None = None,
        secret: str | None = None,
    ) -> None:
        self.member, self.run_id = member, run_id
        # The relay's secret (the chain's listeners check it): in requests over SSH only, never
        # argv, never a log.
        self.secret = secret or secrets.token_hex(32)
        self._stream_id = secrets.token_hex(8)  # names the notice `onward` writes for it
        self._manifest, self._contents, self._hop = manifest, list(contents), hop
        self._told = hop is not None
        self._lock = threading.Lock()
        self._cancelled = False
        self._reply: dict[str, Any] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"seed {member.name}", daemon=True)
        self._thread.start()

    @property
    def seed(self) -> str:
        return self.member.name

    def _run(self) -> None:
        try:
            with self.member.agent.dedicated() as own:
                with self._lock:
                    if self._cancelled:
                        return
                self._reply = send_contents(
                    own,
                    self._manifest,
                    self._contents,
                    protocol.OP_PEERS,
                    wait=0 if self._told else ONWARD_WAIT_S,
                    action=protocol.PEERS_SEED,
                    run_id=self.run_id,
                    stream=self._stream_id,
                    secret=self.secret,
                    next=list(self._hop) if self._hop is not None else None,
                    seconds=ONWARD_WAIT_S,
                )
        except BaseException as exc:  # handed to whoever asks for the outcome
            self._error = exc

    def onward(self, hop: tuple[str, int] | None) -> None:
        """Names the host the seed forwards to; None: there is no chain, it only stores.

        The request shares the seed's connection with the stream, so it waits its turn behind
        the stream's packets: it is sent from a thread of its own, and this one waits for it in
        a way Ctrl-C interrupts at once."""
        self._told = True
        sent: Pending[None] = Pending(self.member.name)

        def send() -> None:
            try:
                self.member.agent.call(
                    protocol.OP_PEERS,
                    action=protocol.PEERS_ONWARD,
                    run_id=self.run_id,
                    stream=self._stream_id,
                    next=list(hop) if hop is not None else None,
                )
                sent.settle(True, None)
            except BaseException as exc:  # handed to the waiting thread
                sent.settle(False, exc)

        threading.Thread(target=send, name=f"onward {self.seed}", daemon=True).start()
        sent.wait()
        sent.result()

    def outcome(self) -> dict[str, Any]:
        """The seed's reply once the stream (and the chain behind it) is done: `chain`, each
        host's error in chain order. Raises what the stream raised (HostError: the seed)."""
        if not self._told:
            self.onward(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._reply

    def settle(self) -> bool:
        """For a seed no chain follows: whether it stored every content."""
        try:
            return not self.outcome().get("chain", [{}])[0].get("error")
        except HostError:
            return False

    def cancel(self) -> None:
        """Stops the stream wherever it is (preflight failed, Ctrl-C, the push failed): the
        stream's connection is dropped, and with it the seed's agent and any content it held in
        part. Closing only the stream's session would wait behind the bytes still in the
        socket's buffers (on a slow uplink, seconds); a call after it reconnects."""
        with self._lock:
            self._cancelled = True
        if not self._thread.is_alive():
            return
        agent = self.member.agent
        with contextlib.suppress(Exception):
            agent.transport.close()
        with contextlib.suppress(Exception):
            agent.close_session()
        self._thread.join(CANCEL_WAIT_S)
