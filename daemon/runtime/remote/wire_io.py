"""Bounds-checked binary reading and writing for the wire format (little-endian).

Every read says which field it is for, so a truncated or malformed message is reported as
`WireError("... <field> at byte <offset> ...")`, never as an index error or a crash.
"""

import struct

import numpy as np

from daemon.runtime.errors import SpecError

ID_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<i4")}  # token ids: uint16 when they fit
COUNT_DTYPE = np.dtype("<u2")
MAX_U16_ID = 0xFFFF


class WireError(SpecError):
    """A message that is not a well-formed specctl draft message."""


class WireWriter:
    def __init__(self, id_width: int) -> None:
        if id_width not in ID_DTYPES:
            raise ValueError(f"id width must be 2 or 4 bytes, got {id_width}")
        self.id_width = id_width
        self._parts: list[bytes] = []

    def pack(self, fmt: str, *values: object) -> None:
        self._parts.append(struct.pack("<" + fmt, *values))

    def ids(self, ids: list[int] | np.ndarray) -> None:
        self._parts.append(np.asarray(ids, dtype=ID_DTYPES[self.id_width]).tobytes())

    def counts(self, counts: np.ndarray) -> None:
        self._parts.append(np.asarray(counts, dtype=COUNT_DTYPE).tobytes())

    def text(self, message: str) -> None:
        data = message.encode("utf-8")[:0xFFFF]
        self.pack("H", len(data))
        self._parts.append(data)

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class WireReader:
    def __init__(self, payload: bytes, what: str) -> None:
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise WireError(f"{what}: expected bytes, got {type(payload).__name__}")
        self._data = memoryview(payload).cast("B")
        self._offset = 0
        self.what = what
        self.id_width = 2

    def error(self, problem: str) -> WireError:
        return WireError(f"{self.what}: {problem} (at byte {self._offset} of {len(self._data)})")

    def _take(self, num_bytes: int, field: str) -> memoryview:
        end = self._offset + num_bytes
        if num_bytes < 0 or end > len(self._data):
            raise self.error(f"truncated: {field} needs {num_bytes} bytes")
        view = self._data[self._offset : end]
        self._offset = end
        return view

    def unpack(self, fmt: str, field: str) -> tuple:
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self._take(size, field))

    def one(self, fmt: str, field: str) -> int | float:
        return self.unpack(fmt, field)[0]

    def ids(self, num: int, field: str) -> np.ndarray:
        dtype = ID_DTYPES[self.id_width]
        data = self._take(num * dtype.itemsize, field)
        out = np.frombuffer(data, dtype=dtype).astype(np.int64)
        if out.size and int(out.min()) < 0:
            raise self.error(f"{field}: negative token id")
        return out

    def counts(self, num: int, field: str) -> np.ndarray:
        data = self._take(num * COUNT_DTYPE.itemsize, field)
        return np.frombuffer(data, dtype=COUNT_DTYPE).astype(np.int64)

    def text(self, field: str) -> str:
        length = int(self.one("H", field + " length"))
        try:
            return bytes(self._take(length, field)).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(f"{field}: not UTF-8 ({exc.reason})") from None

    def finish(self) -> None:
        if self._offset != len(self._data):
            raise self.error(f"{len(self._data) - self._offset} unexpected trailing bytes")


def id_width_for(max_id: int) -> int:
    """Bytes per token id: 2 when every id fits in uint16, else 4."""
    return 2 if max_id <= MAX_U16_ID else 4
