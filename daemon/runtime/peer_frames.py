"""What a daemon does with a frame a peer sent, before anything is handled: decode it into a
message, or answer why not and change nothing.

Both daemons' ROUTER sockets share it: the size limit is the socket's (`MAXMSGSIZE`, set by
`protocol.transport.bind_router`), every field's range is the message model's
(`protocol.messages`), and the warnings are rate-limited, so a flood of garbage costs neither
daemon its log nor its time.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from andrea.daemon.runtime.logthrottle import ThrottledWarning
from andrea.protocol import messages


@dataclass(frozen=True)
class Rejected:
    """A frame that is not a valid message, and the reply that says so."""

    reply: messages.Reply


def decode_or_reject(
    payload: bytes, rejections: ThrottledWarning, what: str = "message", whole_error: bool = False
) -> messages.Message | Rejected:
    """The message in `payload`, or `Rejected` with the error reply to send (`id` "?": the frame
    has no readable one). The warning names `what` was rejected; the reply carries the first line
    of the validation error, or all of it with `whole_error`."""
    try:
        return messages.decode(payload)
    except (ValidationError, ValueError) as e:
        first = str(e).splitlines()[0]
        rejections.warning("rejected an invalid %s (%d bytes): %s", what, len(payload), first)
        detail = str(e) if whole_error else first
        return Rejected(messages.Reply(id="?", ok=False, error=f"invalid message: {detail}"))
