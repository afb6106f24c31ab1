"""How a command asks a run's daemon, over its control socket: a reply, or None when it does not
answer. Whether a daemon runs at all is known from its lock (:func:`andrea.control.offline.daemon_running`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from andrea.daemon.rundir.layout import peer_endpoint
from andrea.protocol.messages import Message, Reply
from andrea.protocol.transport import PeerGone, Unreachable, request


def ask(
    run_dir: Path,
    role: str,
    msg: Message,
    timeout: float = 3.0,
    retries: int = 2,
    alive: Callable[[], bool] | None = None,
) -> Reply | None:
    """The daemon's reply, or None when it does not answer (not running, or wedged). With `alive`
    (a long wait), PeerGone when the daemon exits without answering."""
    ep = peer_endpoint(run_dir, role)
    try:
        # A daemon answers every request with a Reply; `request` is typed for any message.
        return request(ep, msg, timeout=timeout, retries=retries, alive=alive)  # type: ignore[return-value]
    except PeerGone:
        raise
    except Unreachable:
        return None
