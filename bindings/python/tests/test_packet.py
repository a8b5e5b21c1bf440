"""tensorwire.packet: tenso-compatible packets from Python."""

import asyncio
import io
import json
import mmap
import os
import pathlib
import socket
import struct
import sys

import numpy as np
import pytest

import tensorwire
from tensorwire import packet
from tensorwire.packet import QuantizedTensor, RaggedArray, StringTensor

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None
try:
    import scipy.sparse as sparse
except ImportError:  # pragma: no cover
    sparse = None

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "packet"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())

DTYPES = ["float32", "int32", "float64", "int64", "uint8", "uint16", "bool", "float16",
          "int8", "int16", "uint32", "uint64", "complex64", "complex128"]


def sample(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    if dtype.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True).reshape(shape)
    return rng.standard_normal(n).astype(dtype).reshape(shape)


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


# --------------------------------------------------------------------- dense


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 4, 5)])
def test_dense_round_trip(dtype, shape):
    a = sample(dtype, shape)
    out = packet.loads(packet.dumps(a))
    assert_same(out, a)


def test_worked_example_bytes():
    data = packet.dumps(np.array([1, 2, 3, 4, 5], dtype=np.float32))
    assert isinstance(data, memoryview) and data.readonly
    assert len(data) == 84 and bytes(data[:4]) == b"TNSO"
    footer = bytes(packet.dumps(np.arange(1, 6, dtype=np.float32), check_integrity=True))[-8:]
    assert footer == bytes.fromhex("6cfeee4996d661eb")


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes not installed")
def test_bfloat16_round_trip():
    a = np.arange(10, dtype=np.float32).astype(ml_dtypes.bfloat16)
    out = packet.loads(packet.dumps(a))
    assert out.dtype == a.dtype and out.tobytes() == a.tobytes()
    # The streaming writers hand the array's memory out as bytes (bfloat16 has no
    # buffer format of its own) and write the same packet.
    for f in (packet.write_stream, packet.dump):
        buf = io.BytesIO()
        f(a[::2], buf, check_integrity=True)
        assert buf.getvalue() == bytes(packet.dumps(a[::2], check_integrity=True))
    assert b"".join(packet.iter_dumps(a)) == bytes(packet.dumps(a))


@pytest.mark.parametrize("alignment", [1, 8, 32, 64, 128, 4096])
@pytest.mark.parametrize("integrity", [False, True])
def test_alignment_and_integrity(alignment, integrity):
    a = sample("float64", (3, 5))
    data = packet.dumps(a, alignment=alignment, check_integrity=integrity)
    info = packet.get_packet_info(data)
    assert info["integrity_protected"] is integrity
    assert_same(packet.loads(data), a)


def test_alignment_must_be_power_of_two():
    with pytest.raises(ValueError):
        packet.dumps(np.zeros(3), alignment=48)


def test_zero_copy_view_is_read_only_and_keeps_buffer_alive():
    a = sample("float32", (1000,))
    data = packet.dumps(a)
    out = packet.loads(data)
    assert not out.flags.writeable
    body = np.frombuffer(data, dtype=np.uint8)
    assert out.ctypes.data == body.ctypes.data + 64  # the body, not a copy
    del data, body
    assert_same(out, a)  # the buffer lives on through out.base


def test_zero_copy_from_bytearray_and_mmap(tmp_path):
    a = sample("int16", (7, 3))
    path = tmp_path / "x.tnso"
    path.write_bytes(packet.dumps(a))
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    out = packet.loads(mapped)
    assert out.ctypes.data == np.frombuffer(mapped, np.uint8).ctypes.data + 64
    assert_same(out, a)
    del out


def test_copy_true_is_writeable_and_independent():
    a = sample("float32", (16,))
    data = bytearray(packet.dumps(a))
    out = packet.loads(data, copy=True)
    assert out.flags.writeable
    out[0] = 42
    assert_same(packet.loads(data), a)


def test_misaligned_buffer_is_copied_and_correct():
    a = sample("float64", (9,))
    raw = bytes(1) + bytes(packet.dumps(a))
    view = memoryview(raw)[1:]  # body now off by one byte
    out = packet.loads(view)
    assert out.ctypes.data % 8 == 0
    assert not out.flags.writeable
    assert_same(out, a)


def test_big_endian_input_is_byte_swapped():
    a = np.arange(6, dtype=">f4").reshape(2, 3)
    out = packet.loads(packet.dumps(a))
    assert out.dtype == np.dtype("<f4")
    np.testing.assert_array_equal(out, a)


def test_non_contiguous_input():
    a = sample("int32", (4, 6))[:, ::2]
    np.testing.assert_array_equal(packet.loads(packet.dumps(a)), a)
    with pytest.raises(ValueError, match="C-Contiguous"):
        packet.dumps(a, strict=True)


def test_unsupported_inputs():
    with pytest.raises(TypeError):
        packet.dumps([1, 2, 3])
    with pytest.raises(tensorwire.TensorwireError):
        packet.dumps(np.array(["a", "b"]))
    with pytest.raises(TypeError):
        packet.dumps({1: np.zeros(2)})
    with pytest.raises(ValueError, match="at most 255"):
        packet.dumps({str(i): np.zeros(1) for i in range(256)})


def test_compressed_round_trip():
    a = np.zeros((256, 256), dtype=np.float32)
    a[::7] = 3.5
    data = packet.dumps(a, compress=True)
    assert len(data) < a.nbytes // 4
    assert packet.get_packet_info(data)["flags"] & 0x04
    assert_same(packet.loads(data), a)
    assert_same(packet.loads(packet.dumps(a, compress=True, check_integrity=True)), a)


# --------------------------------------------------------------------- other kinds


def test_bundle_round_trip_nested_and_ordered():
    obj = {"w": sample("float32", (3, 4)), "inner": {"b": sample("int8", (5,)),
                                                     "deeper": {"c": np.float64(2.5)}},
           "empty": np.zeros((0, 3), np.int64)}
    out = packet.loads(packet.dumps(obj, check_integrity=True))
    assert list(out) == ["w", "inner", "empty"]
    assert list(out["inner"]) == ["b", "deeper"]
    assert_same(out["w"], obj["w"])
    assert_same(out["inner"]["b"], obj["inner"]["b"])
    assert out["inner"]["deeper"]["c"] == 2.5
    info = packet.get_packet_info(packet.dumps(obj))
    assert info["entry_count"] == 3 and info["flags"] & 0x10


@pytest.mark.parametrize("copy", [False, True])
def test_bundle_members_copied_into_one_arena_are_right(copy):
    # Default (tenso) layout: member bodies sit at arbitrary offsets, so most are
    # copied (into one shared arena); every one must still be exact and aligned.
    obj = {"k" * (i % 7 + 1) + str(i): sample(DTYPES[i % len(DTYPES)], (i % 5, 3), seed=i)
           for i in range(60)}
    out = packet.loads(packet.dumps(obj), copy=copy)
    for key, value in obj.items():
        assert_same(out[key], value)
        assert out[key].ctypes.data % out[key].dtype.alignment == 0
        assert out[key].flags.writeable is copy
    if copy:
        first, second = list(out)[:2]
        out[first][...] = 0
        assert_same(out[second], obj[second])


def _arena_of(out):
    """The one ArenaBuffer the copied members of a decoded bundle share."""
    owners = {id(v.base): v.base for v in out.values()
              if type(v.base).__name__ == "ArenaBuffer"}
    assert len(owners) == 1, owners
    return next(iter(owners.values()))


def test_large_copy_arena_is_reused_only_after_its_arrays_are_gone():
    # ~3 MiB of members at odd offsets: copied into an arena big enough to be pooled.
    rng = np.random.default_rng(7)
    obj = {"k" * (i % 3 + 1) + str(i): rng.standard_normal((64, 129)).astype(np.float32)
           for i in range(96)}
    data = packet.dumps(obj)
    first = packet.loads(data)
    held = {k: v for k, v in first.items() if type(v.base).__name__ == "ArenaBuffer"}
    arena = _arena_of(first)
    # While the first result's arrays live, a second decode must get other memory.
    second = packet.loads(data)
    assert _arena_of(second) is not arena
    for key, value in held.items():
        assert_same(value, obj[key])
    pointers = {k: v.ctypes.data for k, v in held.items()}
    del first, held, arena, value
    # Its buffer is now free for reuse: a third decode may land exactly where the
    # first one was, and every array it gives must still be right.
    third = packet.loads(data)
    assert any(third[k].ctypes.data == p for k, p in pointers.items())
    for key, value in obj.items():
        assert_same(third[key], value)
        assert_same(second[key], value)


def test_aligned_bundle_members_are_zero_copy():
    obj = {f"t{i}": sample("float32", (i + 1, 3), seed=i) for i in range(20)}
    data = packet.dumps(obj, aligned_bundle=True)
    out = packet.loads(data)
    base = np.frombuffer(data, np.uint8).ctypes.data
    for i, (key, value) in enumerate(obj.items()):
        assert_same(out[key], value)
        if i == 0:
            continue  # the first member's place is fixed by the header and its key
        assert base <= out[key].ctypes.data < base + len(data), key  # a view, not a copy
        assert out[key].ctypes.data % 64 == 0


@pytest.mark.skipif(sparse is None, reason="scipy not installed")
@pytest.mark.parametrize("fmt", ["coo", "csr", "csc"])
def test_sparse_round_trip(fmt):
    dense = np.zeros((6, 5), np.float32)
    dense[1, 2], dense[4, 0], dense[5, 4] = 1.5, -2.0, 7.0
    matrix = getattr(sparse, f"{fmt}_matrix")(dense)
    out = packet.loads(packet.dumps(matrix, check_integrity=True))
    assert out.format == fmt and out.shape == (6, 5)
    np.testing.assert_array_equal(out.toarray(), dense)
    bundle = packet.loads(packet.dumps({"m": matrix, "x": np.ones(2)}))
    np.testing.assert_array_equal(bundle["m"].toarray(), dense)


@pytest.mark.skipif(sparse is None, reason="scipy not installed")
@pytest.mark.parametrize("fmt", ["coo", "csr", "csc"])
def test_sparse_matrices_larger_than_the_element_limit_are_written(fmt, tmp_path):
    """A 10^5 x 10^5 matrix of ten values is small: the element limit is for the
    parts, not the logical shape (tenso writes it too). Through dumps, shared memory
    and the cache alike."""
    from tensorwire.cache import TensorCache
    from tensorwire.shm import SharedTensor

    m = getattr(sparse, f"{fmt}_matrix")(
        (np.arange(1.0, 11.0), (np.arange(10) * 9999, np.arange(10))), shape=(100_000, 100_000))
    assert m.shape[0] * m.shape[1] > packet.MAX_ELEMENTS
    out = packet.loads(packet.dumps(m))
    assert out.shape == m.shape and (out != m).nnz == 0
    name = f"tw_test_sparse_{os.getpid()}"
    shared = SharedTensor.create_from(name, m)
    try:
        assert (shared.get(copy=True) != m).nnz == 0
    finally:
        shared.close()
        shared.unlink()
    with TensorCache("1MB") as cache:
        cache.put("m", m)
        assert (cache.get("m") != m).nnz == 0
    with pytest.raises(ValueError, match="wire-format limit"):
        packet.dumps(sparse.csr_matrix((2, 2**32)))


@pytest.mark.skipif(sparse is None, reason="scipy not installed")
@pytest.mark.parametrize("fmt", ["coo", "csr", "csc"])
@pytest.mark.parametrize("damage", ["index", "negative", "pointers", "last_pointer_0", "first_pointer"])
def test_sparse_packets_with_bad_indices_are_malformed(fmt, damage):
    dense = np.zeros((6, 5), np.float32)
    dense[1, 2], dense[4, 0], dense[5, 4] = 1.5, -2.0, 7.0
    matrix = getattr(sparse, f"{fmt}_matrix")(dense)
    # Damage the parts in place, after scipy's checks, as a hostile sender could.
    if fmt == "coo":
        if damage in ("pointers", "last_pointer_0", "first_pointer"):
            matrix.row[-1] = 6
        else:
            matrix.col[0] = 99 if damage == "index" else -1
    elif damage == "pointers":
        matrix.indptr[1], matrix.indptr[2] = matrix.indptr[2] + 1, matrix.indptr[1]
    elif damage == "last_pointer_0":
        # scipy's own full check skips a matrix whose last pointer is 0, and its
        # kernels then read past the emptied indices (a segfault in toarray()).
        matrix.indptr[:] = 0
        matrix.indptr[1] = 3
    elif damage == "first_pointer":
        matrix.indptr[0] = 1
    else:
        matrix.indices[0] = 99 if damage == "index" else -1
    data = packet.dumps(matrix)
    with pytest.raises(tensorwire.MalformedError, match=f"sparse {fmt} packet"):
        packet.loads(data)


def _sparse_packet(flag, shape, parts):
    """A tenso v4 sparse packet (float32 values) of `shape` over packed `parts`."""
    out = b"TNSO" + bytes([4]) + struct.pack("<H", flag) + bytes([0, len(shape), 0])
    out += b"".join(struct.pack("<I", d) for d in shape)
    for part in parts:
        packed = bytes(packet.dumps(part))
        out += struct.pack("<I", len(packed)) + packed
    return out


@pytest.mark.parametrize("flag", [0x08, 0x20, 0x40], ids=["coo", "csr", "csc"])
@pytest.mark.parametrize("shape", [[], [2], [2, 2, 2]], ids=str)
def test_sparse_packets_that_are_not_matrices_are_malformed(flag, shape):
    """tenso writes a 1-D scipy array as a sparse packet it cannot read back; such
    packets are refused by every reader with a clear error (once an IndexError)."""
    parts = [np.array([1, 2], np.float32), np.array([0, 1], np.int64),
             np.array([0, 1] if flag == 0x08 else [0, 1, 2], np.int64)]
    data = _sparse_packet(flag, shape, parts)
    with pytest.raises(tensorwire.MalformedError, match="2-D matrices"):
        packet.loads(data)
    with pytest.raises(tensorwire.MalformedError, match="2-D matrices"):
        list(packet.read_stream(io.BytesIO(data)))


@pytest.mark.skipif(sparse is None, reason="scipy not installed")
@pytest.mark.parametrize("flag", [0x08, 0x20, 0x40], ids=["coo", "csr", "csc"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_sparse_packets_of_types_scipy_lacks_are_unsupported(flag, dtype):
    """scipy builds a float16 CSR matrix that its own methods then refuse: such a
    packet is refused by name instead (float32 reads as before)."""
    parts = [np.array([1, 2], dtype), np.array([0, 1], np.int64),
             np.array([0, 1] if flag == 0x08 else [0, 1, 2], np.int64)]
    data = _sparse_packet(flag, [2, 2], parts)
    if dtype == np.float16:
        with pytest.raises(tensorwire.UnsupportedError, match="scipy.sparse has no float16"):
            packet.loads(data)
    else:
        m = packet.loads(data)
        assert m.tocoo().dtype == np.float32 and m.sum() == 3


@pytest.mark.skipif(sparse is None or not hasattr(sparse, "csr_array"),
                    reason="scipy with sparse arrays not installed")
def test_one_dimensional_sparse_arrays_are_not_written():
    for make in (sparse.csr_array, sparse.coo_array):
        try:
            vector = make(np.array([1.0, 0.0, 2.0]))
        except (TypeError, ValueError):
            continue  # this scipy builds 2-D arrays only
        with pytest.raises(tensorwire.InvalidArgumentError, match="2-D matrices"):
            packet.dumps(vector)


@pytest.mark.parametrize("strings", [["hello", "wörld", "", "🙂"], [], ["x" * 1000]])
def test_string_tensor(strings):
    st = StringTensor(strings)
    out = packet.loads(st.dumps(check_integrity=True))
    assert isinstance(out, StringTensor)
    assert out.to_list() == strings and len(out) == len(strings)
    assert StringTensor.loads(st.dumps()) == st
    if strings:
        assert out[-1] == strings[-1]
        with pytest.raises(IndexError):
            out[len(strings)]


def test_string_tensor_elements_are_str_or_bytes_like():
    """Bytes-like elements are their bytes (as tenso takes them); an int is refused
    with a TypeError, as tenso refuses it, not turned into that many NUL bytes."""
    st = StringTensor([b"ab", bytearray(b"c"), memoryview(b"de"), np.bytes_(b"f")])
    assert packet.loads(st.dumps()).to_list() == ["ab", "c", "de", "f"]
    for bad in ([3], [np.int64(2)], ["ok", None]):
        with pytest.raises(TypeError):
            StringTensor(bad)


def test_ragged_array():
    rows = [np.array([1, 2, 3], np.int32), np.array([], np.int32), np.array([4], np.int32)]
    ra = RaggedArray(rows)
    data = ra.dumps()
    out = RaggedArray.loads(data)
    assert len(out) == 3 and out.dtype == np.int32
    for got, want in zip(out, rows):
        np.testing.assert_array_equal(got, want)
    assert isinstance(packet.loads(data), dict)  # what tenso returns too


@pytest.mark.parametrize("dtype", ["qint8", "quint8", "qint4", "quint4"])
@pytest.mark.parametrize("scheme,kw", [("per_tensor", {}), ("per_channel", {"axis": 1}),
                                       ("per_group", {"group_size": 5})])
def test_quantized_round_trip(dtype, scheme, kw):
    x = sample("float32", (4, 7), seed=3)
    q = QuantizedTensor.quantize(x, dtype, scheme=scheme, **kw)
    out = packet.loads(packet.dumps(q, check_integrity=True))
    assert isinstance(out, QuantizedTensor) and out == q
    approx = out.dequantize()
    step = float(np.max(q.scales))
    assert np.max(np.abs(approx - x)) <= step * 0.51 + 1e-6


def test_ipc_ref_round_trip():
    ref = packet.IpcRef(bytes(range(64)), 4096, 1 << 20, bytes(range(16)))
    data = packet.dumps(ref)
    assert len(data) == 106
    assert packet.loads(data) == ref


# --------------------------------------------------------------------- fixtures


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_decodes_and_reencodes_byte_for_byte(name):
    raw = (FIXTURES / f"{name}.tnso").read_bytes()
    value = packet.loads(raw)
    entry = EXPECTED[name]
    if "hex" in entry and isinstance(value, np.ndarray):
        assert value.tobytes().hex() == entry["hex"]
        assert list(value.shape) == entry["shape"]
    if entry.get("version", 4) == 3 or entry.get("framing") == "flag":
        return  # we write v4, and ragged arrays the way tenso does (as a bundle)
    again = packet.dumps(value, check_integrity=entry.get("integrity", False),
                         compress=entry.get("compress", False),
                         alignment=entry.get("alignment", 64))
    assert bytes(again) == raw


# --------------------------------------------------------------------- errors


def test_hostile_inputs_raise_typed_errors():
    good = bytes(packet.dumps(np.arange(10, dtype=np.float32), check_integrity=True))
    with pytest.raises(tensorwire.BadMagicError):
        packet.loads(b"XXXX" + good[4:])
    for cut in (0, 3, 9, 20, 64, len(good) - 1):
        with pytest.raises(tensorwire.FormatError):
            packet.loads(good[:cut])
    flipped = bytearray(good)
    flipped[70] ^= 1
    with pytest.raises(tensorwire.ChecksumError):
        packet.loads(flipped)
    huge = bytearray(good[:14])
    huge[8] = 40  # ndim above the limit
    with pytest.raises(tensorwire.LimitExceededError):
        packet.loads(huge)


def test_format_errors_are_value_errors_like_tensos():
    with pytest.raises(ValueError):
        packet.loads(b"TNSO\x04" + bytes(3))
    assert issubclass(tensorwire.ChecksumError, ValueError)
    assert issubclass(tensorwire.FormatError, tensorwire.TensorwireError)


def test_unknown_version_is_unsupported():
    with pytest.raises(tensorwire.UnsupportedError):
        packet.loads(b"TNSO\x09" + bytes(20))


# --------------------------------------------------------------------- streams


def many_values():
    return [sample("float32", (3, 3)), {"a": sample("int8", (4,))}, np.zeros(0, np.int64),
            StringTensor(["a", "bc"]), sample("uint16", (2, 2, 2))]


def check_equal(got, want):
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            check_equal(got[k], want[k])
    elif isinstance(want, np.ndarray):
        assert_same(got, want)
    else:
        assert got == want


def test_write_then_read_stream_file(tmp_path):
    path = tmp_path / "stream.tnso"
    with open(path, "wb") as f:
        total = sum(packet.write_stream(v, f, check_integrity=True) for v in many_values())
    assert path.stat().st_size == total
    with open(path, "rb") as f:
        for want in many_values():
            check_equal(packet.read_stream(f), want)
        assert packet.read_stream(f) is None


def test_dump_and_load_with_and_without_mmap(tmp_path):
    path = tmp_path / "two.tnso"
    a, b = sample("float32", (100,)), sample("int64", (3, 3))
    with open(path, "wb") as f:
        packet.dump(a, f)
        packet.dump(b, f, check_integrity=True)
    for mmap_mode in (False, True):
        with open(path, "rb") as f:
            assert_same(packet.load(f, mmap_mode=mmap_mode), a)
            assert_same(packet.load(f, mmap_mode=mmap_mode), b)
            with pytest.raises(EOFError):
                packet.load(f, mmap_mode=mmap_mode)


def test_iter_dumps_parts_concatenate_to_dumps():
    a = sample("complex64", (5, 2))
    parts = list(packet.iter_dumps(a, check_integrity=True))
    assert b"".join(bytes(p) for p in parts) == bytes(packet.dumps(a, check_integrity=True))


def test_read_stream_truncated_and_bytes_io():
    data = bytes(packet.dumps(sample("float32", (50,))))
    with pytest.raises(tensorwire.TruncatedError):
        packet.read_stream(io.BytesIO(data[:-3]))
    assert packet.read_stream(io.BytesIO(b"")) is None
    check_equal(packet.read_stream(io.BytesIO(data)), sample("float32", (50,)))


def test_read_stream_refuses_lying_length_without_allocating():
    # A header announcing ~4 GiB of float32 followed by nothing.
    lie = b"TNSO\x04\x01\x00\x01\x02\x00" + (65535).to_bytes(4, "little") * 2
    with pytest.raises(tensorwire.FormatError):
        packet.read_stream(io.BytesIO(lie))


def test_socket_stream_round_trip():
    left, right = socket.socketpair()
    with left, right:
        values = many_values()
        for v in values:
            packet.write_stream(v, left)
        left.shutdown(socket.SHUT_WR)
        for want in values:
            check_equal(packet.read_stream(right), want)
        assert packet.read_stream(right) is None


def test_async_streams():
    async def main():
        values = many_values() + [np.zeros((300, 300), np.float32)]
        server_got = []

        async def handle(reader, writer):
            while (value := await packet.aread_stream(reader)) is not None:
                server_got.append(value)
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for v in values:
            await packet.awrite_stream(v, writer, check_integrity=True)
        writer.close()
        await writer.wait_closed()
        for _ in range(100):
            if len(server_got) == len(values):
                break
            await asyncio.sleep(0.02)
        server.close()
        await server.wait_closed()
        return values, server_got

    values, got = asyncio.run(main())
    assert len(got) == len(values)
    for g, w in zip(got, values):
        check_equal(g, w)


def test_packet_info_and_is_aligned():
    info = packet.get_packet_info(packet.dumps(np.zeros((2, 3), np.float32)))
    assert info["version"] == 4 and info["shape"] == (2, 3) and info["ndim"] == 2
    assert info["dtype"] == np.dtype(np.float32) and info["total_elements"] == 6
    assert info["data_size_bytes"] == 24 and info["aligned"] is True
    q = QuantizedTensor.quantize(np.arange(7, dtype=np.float32), "qint4")
    qinfo = packet.get_packet_info(packet.dumps(q))
    assert qinfo["dtype"] == "qint4" and qinfo["quantized"] and qinfo["data_size_bytes"] == 4
    assert packet.is_aligned(packet.dumps(np.zeros(3)))
    assert not packet.is_aligned(memoryview(bytes(packet.dumps(np.zeros(3))))[1:], 2)


def test_per_channel_axis_may_count_from_the_end():
    """As tenso: a negative axis is kept as given and written as its low byte (-1 is
    255); read back it is -1 again and dequantizes along the last axis. One outside
    the dimensions is numpy's AxisError (an IndexError) when quantizing."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    q = QuantizedTensor.quantize(x, "qint8", scheme="per_channel", axis=-1)
    assert q.axis == -1 and len(q.scales) == 5
    data = bytes(packet.dumps(q))
    back = packet.loads(data)
    assert back.axis == -1 and back == q
    # The per-channel step bounds the error; the wrong axis would not.
    step = float(q.scales.max())
    assert np.abs(back.dequantize() - x).max() <= step
    same = QuantizedTensor.quantize(np.moveaxis(x, 2, 0), "qint8", scheme="per_channel", axis=0)
    np.testing.assert_allclose(np.moveaxis(same.dequantize(), 0, 2), back.dequantize())
    for axis in (3, 7, -4):
        with pytest.raises(IndexError):
            QuantizedTensor.quantize(x, "qint8", scheme="per_channel", axis=axis)


def test_stream_errors_are_tensos():
    """A stream that ends inside a packet is an EOFError (and a TruncatedError); an
    unsupported packet or dtype a ValueError (and an UnsupportedError)."""
    data = bytes(packet.dumps(sample("float32", (50,))))
    with pytest.raises(EOFError) as info:
        packet.read_stream(io.BytesIO(data[:-3]))
    assert isinstance(info.value, tensorwire.TruncatedError)

    async def read_cut():
        reader = asyncio.StreamReader()
        reader.feed_data(data[:20])
        reader.feed_eof()
        return await packet.aread_stream(reader)

    with pytest.raises(EOFError):
        asyncio.run(read_cut())
    future = bytearray(data)
    future[4] = 5  # protocol version 5
    for call in (lambda: packet.loads(bytes(future)), lambda: packet.get_packet_info(bytes(future)),
                 lambda: packet.read_stream(io.BytesIO(bytes(future))),
                 lambda: packet.dumps(np.array([object()]))):
        with pytest.raises(ValueError) as info:
            call()
        assert isinstance(info.value, tensorwire.UnsupportedError)


def test_loads_reads_the_first_packet_of_a_longer_buffer():
    """As tenso: bytes after the packet (a shared-memory segment's slack, a second
    packet) are not read."""
    a, b = sample("float32", (7,)), sample("int16", (3, 2))
    two = bytes(packet.dumps(a)) + bytes(packet.dumps(b))
    check_equal(packet.loads(two), a)
    check_equal(packet.loads(bytes(packet.dumps(b)) + b"\0" * 269), b)


def test_integer_types_for_alignment_and_buffers_from_read():
    """numpy integers are alignments; a read() that returns a bytearray or memoryview
    feeds read_stream."""
    x = sample("float64", (4,))
    assert bytes(packet.dumps(x, alignment=np.int64(128))) == bytes(packet.dumps(x, alignment=128))
    data = bytes(packet.dumps(x))

    class Source:
        def __init__(self, kind):
            self.kind, self.stream = kind, io.BytesIO(data)

        def read(self, n):
            return self.kind(self.stream.read(n))

    for kind in (bytearray, memoryview):
        check_equal(packet.read_stream(Source(kind)), x)


def test_awrite_stream_sends_what_the_array_held_when_called():
    """The transport may queue what it is given past drain(): awrite_stream hands it
    copies, so changing the array afterwards never reaches the peer."""
    x = np.zeros(4096, np.float32)
    queued = []

    class Writer:
        def write(self, part):
            queued.append(part)

        async def drain(self):
            pass

    asyncio.run(packet.awrite_stream(x, Writer()))
    x[:] = 7
    check_equal(packet.loads(b"".join(bytes(p) for p in queued)), np.zeros(4096, np.float32))


def test_read_stream_readinto_that_shrinks_its_buffer_is_a_typed_error():
    """A readinto that resizes the buffer it was lent (any Python code may) and
    reports more bytes than the buffer then holds is a broken source: OSError, as io
    raises for a raw readinto returning a bad length, not a Rust panic."""
    data = bytes(packet.dumps(np.arange(8, dtype=np.float32)))

    class Shrinks:
        def __init__(self, cut):
            self.stream, self.cut = io.BytesIO(data), cut

        def readinto(self, buf):
            n = self.stream.readinto(buf)
            del buf[self.cut:]
            return n

    for cut in (0, 3):
        with pytest.raises(OSError, match="readinto"):
            packet.read_stream(Shrinks(cut))

    class Overstates:
        def readinto(self, buf):
            return len(buf) + 1

    with pytest.raises(OSError, match="readinto"):
        packet.read_stream(Overstates())


def test_read_stream_keeps_a_buffer_readinto_kept():
    """The lent buffer may outlive the call (a source keeping it): read_stream copies
    out what it holds then, and later changes to it reach nothing."""
    x = sample("float32", (40,))
    data = bytes(packet.dumps(x))
    kept = []

    class Keeps:
        def __init__(self):
            self.stream = io.BytesIO(data)

        def readinto(self, buf):
            kept.append(buf)
            return self.stream.readinto(buf)

    got = packet.read_stream(Keeps())
    for buf in kept:
        buf[:] = b"\xff" * len(buf)
    check_equal(got, x)


class _NotReadyAt:
    """A non-blocking source: `read`/`readinto` return None (no data ready) on the
    calls listed, as a non-blocking pipe or file does."""

    def __init__(self, data, stalls, method):
        self.stream, self.stalls, self.calls = io.BytesIO(data), set(stalls), 0
        if method == "read":
            self.read = self._read
        else:
            self.readinto = self._readinto

    def _stalled(self):
        self.calls += 1
        return self.calls in self.stalls

    def _read(self, n):
        return None if self._stalled() else self.stream.read(n)

    def _readinto(self, buf):
        return None if self._stalled() else self.stream.readinto(buf)


@pytest.mark.parametrize("method", ["readinto", "read"])
def test_read_stream_none_from_a_non_blocking_source_is_not_the_end(method):
    """None from readinto/read means "no data yet", not end of stream: BlockingIOError,
    and the next read_stream of the same source goes on with the packet begun (no byte
    lost, no false clean end, no StreamEndedError)."""
    x = np.arange(1000, dtype=np.float32)
    data = bytes(packet.dumps(x)) * 2
    for stalls in ([1], [2], [2, 3], [1, 3, 5]):
        src = _NotReadyAt(data, stalls, method)
        got = []
        for _ in range(20):
            try:
                value = packet.read_stream(src)
            except BlockingIOError:
                continue
            if value is None:
                break
            got.append(value)
        assert len(got) == 2, stalls
        for value in got:
            check_equal(value, x)


def test_read_stream_non_blocking_socket_resumes_the_packet():
    """A non-blocking socket raises BlockingIOError itself; a packet that arrives in
    pieces is read whole once the rest is there."""
    x = sample("float64", (300,))
    data = bytes(packet.dumps(x))
    left, right = socket.socketpair()
    with left, right:
        right.setblocking(False)
        with pytest.raises(BlockingIOError):
            packet.read_stream(right)
        left.sendall(data[:100])
        with pytest.raises(BlockingIOError):
            packet.read_stream(right)
        left.sendall(data[100:])
        check_equal(packet.read_stream(right), x)
        left.close()
        assert packet.read_stream(right) is None
