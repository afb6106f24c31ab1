"""A zstd-compressed file's bytes as a stream (``.jsonl.zst``, as SlimPajama ships its shards),
read with bounded memory; a corrupt or truncated file is an error, never a silent short read.

The `zstandard` package's `stream_reader` bounds what one read returns, but ends a truncated
frame without a word (half a file became half the documents); its `decompressobj` tells a frame's
end (`eof`), but returns at once all the output of the input it is given. So the input is fed in
pieces of `FEED` bytes: a zstd block holds at most 128 KiB and takes at least 4 bytes (an RLE
block: a header and the byte), so one piece makes at most `FEED` × 32 KiB (64 MiB), whatever the
file (a "zstd bomb" of zeros included). Frames follow one another (``zstd`` writes one per input,
``pzstd`` many); skippable frames are passed over by the library.
"""

from __future__ import annotations

import io

#: Compressed bytes handed to the decompressor at a time (see the module's docstring).
FEED = 2 << 10
#: The file name endings of zstd-compressed data.
SUFFIX = ".zst"


class ZstdDataError(ValueError):
    """The stream is not zstd data, is corrupt, or ends inside a frame."""


class ZstdReader(io.RawIOBase):
    """The decompressed bytes of the zstd stream `source` (every frame, in order)."""

    def __init__(self, source: io.BufferedIOBase) -> None:
        import zstandard

        super().__init__()
        self._source = source
        self._error = zstandard.ZstdError
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame = self._decompressor.decompressobj()
        self._fed = 0  # compressed bytes fed to the current frame
        #: Compressed bytes decompressed so far.
        self.consumed = 0
        self._pending = memoryview(b"")
        self._input = b""
        self._done = False

    def readable(self) -> bool:
        return True

    # Narrower than RawIOBase's (any writable buffer): io's buffered readers pass these two.
    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._pending and not self._done:
            self._pending = memoryview(self._decompress())
        n = min(len(buffer), len(self._pending))
        memoryview(buffer)[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _decompress(self) -> bytes:
        if not self._input:
            self._input = self._source.read(64 * FEED)
            if not self._input:
                self._done = True
                if self._fed and not self._frame.eof:
                    raise ZstdDataError("it ends inside a frame: truncated")
                return b""
        piece, self._input = self._input[:FEED], self._input[FEED:]
        try:
            if self._frame.eof:  # the previous frame ended: what follows starts a new one
                self._frame, self._fed = self._decompressor.decompressobj(), 0
            self._fed += len(piece)
            self.consumed += len(piece)
            out = self._frame.decompress(piece)
            if self._frame.eof and self._frame.unused_data:
                # Past a frame's end within this piece: the next frame's first bytes.
                self._input = self._frame.unused_data + self._input
                self.consumed -= len(self._frame.unused_data)
        except self._error as e:
            raise ZstdDataError(str(e)) from None
        return out
