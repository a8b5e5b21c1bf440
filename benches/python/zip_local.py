"""Where a ZIP member's data starts, as the benchmarks' header-reading references find
it: its local header (the name and extra-field lengths at byte 26) says so, and the
central directory does not."""

import struct

_LOCAL = struct.Struct("<4s22xHH").unpack_from


def data_start(buf, header_offset: int) -> int:
    """The offset of the data of the member whose local header is at `header_offset`
    in `buf` (a map of the archive), read from that header."""
    magic, name_len, extra_len = _LOCAL(buf, header_offset)
    if magic != b"PK\x03\x04":
        raise ValueError(f"no local header at {header_offset}")
    return header_offset + 30 + name_len + extra_len
