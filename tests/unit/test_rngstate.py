"""The RNG states of a manifest, checked at the depth a reader needs: torch's own trial where a
state may be restored, the shape alone where it never is (the proxy, andreactl), without torch."""

from __future__ import annotations

import base64
import struct

import pytest
import torch
from pydantic import ValidationError

from andrea.daemon.checkpoint import rngstate
from andrea.daemon.checkpoint.rngstate import SHAPE_ONLY, RngState

#: Offset of mt19937's `left` counter in torch's CPU generator state (after the 8-byte seed).
_LEFT = 8


def _state_with_torch_cpu(raw: bytes) -> dict:
    state = rngstate.capture().model_dump()
    state["torch_cpu"] = base64.b64encode(raw).decode("ascii")
    return state


def _invalid_torch_state() -> bytes:
    """The right size, but a state torch refuses (a counter of 0: never a generator's)."""
    raw = bytearray(torch.get_rng_state().numpy().tobytes())
    struct.pack_into("<i", raw, _LEFT, 0)
    with pytest.raises(RuntimeError):  # the premise: torch itself refuses it
        torch.Generator().set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    return bytes(raw)


def test_a_state_torch_refuses_is_damaged_where_it_may_be_restored() -> None:
    with pytest.raises(ValidationError, match="torch CPU RNG state rejected"):
        RngState.model_validate(_state_with_torch_cpu(_invalid_torch_state()))


def test_a_reader_that_never_restores_checks_the_shape_only() -> None:
    state = _state_with_torch_cpu(_invalid_torch_state())
    assert RngState.model_validate(state, context=SHAPE_ONLY).torch_cpu == state["torch_cpu"]
    short = _state_with_torch_cpu(_invalid_torch_state()[:-8])
    with pytest.raises(ValidationError, match="5048 bytes, expected 5056"):
        RngState.model_validate(short, context=SHAPE_ONLY)


def test_a_captured_state_passes_both_depths_and_restores() -> None:
    state = rngstate.capture()
    again = RngState.model_validate(state.model_dump())
    assert again == RngState.model_validate(state.model_dump(), context=SHAPE_ONLY)
    expected = torch.rand(3)
    rngstate.restore(again)
    assert torch.equal(torch.rand(3), expected)
