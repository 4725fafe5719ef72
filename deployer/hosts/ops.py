"""Each op of the agent as one typed value: its name on the wire, the shape of its request and
the shape of its reply (remote/protocol.py, docs/PROTOCOL.md).

`Channel.ask` takes one of these with the request: an op asked with another op's request, a
request with a misspelt or missing field, or a reply read as another op's, is a type error
here. On the host the agent's handlers return the same reply shapes (mypy --strict on remote/)
and read their requests through params.py's checks, since a request is untrusted there. Ops
whose replies differ by `action` (keep, netcheck, peers, firewall) have one value per action.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from remote import protocol

RequestT = TypeVar("RequestT")
ReplyT = TypeVar("ReplyT")


@dataclass(frozen=True)
class Op(Generic[RequestT, ReplyT]):
    """One op: `name` on the wire; `reply` the shape its reply is checked against."""

    name: str
    reply: Callable[..., ReplyT]


def _op(name: str, request: type[RequestT], reply: Callable[..., ReplyT]) -> Op[RequestT, ReplyT]:
    """`request` is named only for the type checker: it binds the op's request shape."""
    del request
    return Op(name, reply)


P = protocol
HAVE = _op(P.OP_HAVE, P.HaveRequest, P.HaveReply)
MATERIALIZE = _op(P.OP_MATERIALIZE, P.MaterializeRequest, P.MaterializeReply)
START = _op(P.OP_START, P.StartRequest, P.TasksReply)
POLL = _op(P.OP_POLL, P.PollRequest, P.PollReply)
STOP = _op(P.OP_STOP, P.StopRequest, P.StopReply)
IDLE = _op(P.OP_IDLE, P.IdleRequest, P.IdleReply)
DETACH = _op(P.OP_DETACH, P.RunRequest, P.DetachReply)
RELEASE = _op(P.OP_RELEASE, P.RunRequest, P.ReleaseReply)
KEEP_WARDEN = _op(P.OP_KEEP, P.KeepRequest, P.KeepWardenReply)
KEEP_KEEPER = _op(P.OP_KEEP, P.KeepRequest, P.PeersPidReply)
SETUP = _op(P.OP_SETUP, P.SetupRequest, P.SetupReply)
ENVIRONMENT = _op(P.OP_ENVIRONMENT, P.EnvRequest, P.EnvReply)
ENV_PROGRESS = _op(P.OP_ENV_PROGRESS, P.EnvProgressRequest, P.EnvProgressReply)
IMAGE = _op(P.OP_IMAGE, P.ImageRequest, P.ImageReply)
GPUS = _op(P.OP_GPUS, P.GpusRequest, P.GpusReply)
PROFILE = _op(P.OP_PROFILE, P.ProfileRequest, P.ProfileReply)
NETCHECK_LISTEN = _op(P.OP_NETCHECK, P.NetcheckRequest, P.ListenReply)
NETCHECK_PROBE = _op(P.OP_NETCHECK, P.NetcheckRequest, P.ProbeReply)
NETCHECK_CLOSE = _op(P.OP_NETCHECK, P.NetcheckRequest, P.ClosedReply)
PEERS_START = _op(P.OP_PEERS, P.PeersRequest, P.PeersPidReply)
PEERS_CLOSE = _op(P.OP_PEERS, P.PeersRequest, P.ClosedReply)
COLLECT = _op(P.OP_COLLECT, P.CollectRequest, P.CollectReply)
FIREWALL_CHECK = _op(P.OP_FIREWALL, P.FirewallRequest, P.FirewallCheckReply)
FIREWALL_RULES = _op(P.OP_FIREWALL, P.FirewallRequest, P.FirewallRulesReply)
FIREWALL_REMOVE = _op(P.OP_FIREWALL, P.FirewallRequest, P.FirewallRemoveReply)
RUNS = _op(P.OP_RUNS, P.RunsRequest, P.RunsReply)
PRUNE = _op(P.OP_PRUNE, P.PruneRequest, P.PruneReply)
