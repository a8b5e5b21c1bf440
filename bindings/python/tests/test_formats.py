"""safetensors, GGUF, NPY and NPZ files read through tensorwire.Reader, compared with
what numpy (always installed) and the real packages (when installed) read; files we
write read back by the real safetensors package."""

import glob
import hashlib
import io
import json
import os
import struct
import tokenize
import zlib

import numpy as np
import pytest

import tensorwire
from conftest import REPO

NUMPY = os.path.join(REPO, "fixtures", "numpy")
SAFETENSORS = os.path.join(REPO, "fixtures", "safetensors")
GGUF = os.path.join(REPO, "fixtures", "gguf")

NPY_FILES = sorted(
    p for p in glob.glob(os.path.join(NUMPY, "*.npy"))
    if os.path.exists(p[: -len(".npy")] + ".expected.json")
)
NPZ_FILES = ["arrays.npz", "compressed.npz", "one.npz"]
REFUSED = ["object.npy", "structured.npy", "strings.npy", "datetime.npy", "with_object.npz"]


@pytest.mark.parametrize("path", NPY_FILES, ids=os.path.basename)
def test_npy_reads_what_numpy_reads(path):
    want = np.load(path)
    with tensorwire.open(path) as r:
        assert r.format == "npy"
        assert list(r.keys()) == ["array"]
        got = r["array"]
    assert got.dtype == want.dtype.newbyteorder("=")
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_fortran_arrays_are_zero_copy_strided_views():
    path = os.path.join(NUMPY, "fortran.npy")
    got = tensorwire.open(path)["array"]
    assert got.flags.f_contiguous and not got.flags.c_contiguous
    assert isinstance(got.base, tensorwire.BytesOwner)
    np.testing.assert_array_equal(got, np.load(path))
    # A copy is C-ordered and owns its data.
    copied = tensorwire.open(path).read_numpy("array", copy=True)
    assert copied.flags.c_contiguous
    np.testing.assert_array_equal(copied, got)


def test_fortran_arrays_that_are_copied_stay_column_major(tmp_path):
    a = np.asfortranarray(np.arange(24, dtype=">f4").reshape(2, 3, 4))
    np.save(tmp_path / "be.npy", a)
    np.savez_compressed(tmp_path / "z.npz", f=np.asfortranarray(np.arange(12.0).reshape(3, 4)),
                        c=np.arange(6).reshape(2, 3))
    with np.load(tmp_path / "z.npz") as z:
        cases = [(tmp_path / "be.npy", "array", np.load(tmp_path / "be.npy")),
                 (tmp_path / "z.npz", "f", z["f"]), (tmp_path / "z.npz", "c", z["c"])]
    for path, key, want in cases:
        got = tensorwire.open(str(path))[key]
        assert got.flags.f_contiguous == want.flags.f_contiguous, (path, key)
        assert got.flags.c_contiguous == want.flags.c_contiguous, (path, key)
        assert got.dtype == want.dtype.newbyteorder("=") and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert got.flags.writeable
    # A .zt converted from a Fortran-order array keeps the attribute over C order.
    tensorwire.convert(str(tmp_path / "be.npy"), str(tmp_path / "be.zt"), compress=True)
    got = tensorwire.open(str(tmp_path / "be.zt"))["array"]
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, a)


def test_c_order_arrays_are_zero_copy_and_big_endian_ones_are_swapped_copies():
    c = tensorwire.open(os.path.join(NUMPY, "c_order.npy"))["array"]
    assert isinstance(c.base, tensorwire.BytesOwner)
    be = tensorwire.open(os.path.join(NUMPY, "big_endian.npy"))["array"]
    assert be.dtype == np.dtype("<f8")
    assert not isinstance(be.base, tensorwire.BytesOwner)
    np.testing.assert_array_equal(be, np.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("name", NPZ_FILES)
def test_npz_reads_what_numpy_reads(name):
    path = os.path.join(NUMPY, name)
    with np.load(path) as want, tensorwire.open(path) as r:
        assert r.format == "npz"
        assert sorted(r.keys()) == sorted(want.files)
        for key in want.files:
            np.testing.assert_array_equal(r[key], want[key])
            assert r[key].shape == want[key].shape


def test_npz_archives_numpy_reads_at_the_edges_are_read(tmp_path):
    # Exactly 65 535 members: zipfile writes the count 0xFFFF with no ZIP64 record.
    many = str(tmp_path / "many.npz")
    np.savez(many, **{f"a{i}": np.int8(i % 100) for i in range(65535)})
    with tensorwire.open(many) as r:
        assert len(r.keys()) == 65535 and r["a65534"] == 65534 % 100
    # No members at all, and bytes appended after an archive.
    empty = str(tmp_path / "empty.npz")
    np.savez(empty)
    with tensorwire.open(empty) as r:
        assert r.format == "npz" and r.keys() == []
    tail = tmp_path / "tail.npz"
    np.savez(str(tail), x=np.arange(3))
    with open(tail, "ab") as f:
        f.write(b"\0" * 100)
    np.testing.assert_array_equal(tensorwire.open(str(tail))["x"], np.load(str(tail))["x"])


def test_npz_end_records_are_chosen_as_zipfile_chooses_them(tmp_path):
    arrays = dict(x=np.arange(3), y=np.ones(2))
    data = _npz_bytes(tmp_path, **arrays)
    eocd = data.rfind(b"PK\x05\x06")
    # A saturated count with no ZIP64 record: the directory's size says how many,
    # as zipfile reads it.
    saturated = bytearray(data)
    saturated[eocd + 8:eocd + 12] = b"\xff\xff\xff\xff"
    assert sorted(_open_bytes(tmp_path, saturated).keys()) == ["x", "y"]
    # A comment cut short, and bytes appended: still the last end record.
    cut = data + b"trailing bytes"
    cut[eocd + 20:eocd + 22] = (50).to_bytes(2, "little")
    assert sorted(_open_bytes(tmp_path, cut).keys()) == ["x", "y"]
    # A fake archive inside the last member's data does not win over the real end
    # record (zipfile and miniz take the last signature).
    fake = np.frombuffer(b"PK\x05\x06" + bytes(18), np.uint8)
    data = _npz_bytes(tmp_path, a=np.arange(3), pad=fake)
    data[data.rfind(b"PK\x05\x06") + 20] = 9   # the real record's comment runs past
    with np.load(io.BytesIO(bytes(data))) as want, _open_bytes(tmp_path, data) as got:
        assert sorted(got.keys()) == sorted(want.files) == ["a", "pad"]


def _with_zip64_end(data, count=None):
    """An archive's end records rebuilt with a ZIP64 end record and locator (as
    zipfile writes them past 65 535 members), the 32-bit count saturated."""
    eocd = len(data) - 22
    n, size, offset = struct.unpack("<HII", data[eocd + 10:eocd + 20])
    out = bytes(data[:offset + size])
    record_at = len(out)
    c = n if count is None else count
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, c, c, size, offset)
    out += struct.pack("<IIQI", 0x07064B50, 0, record_at, 1)
    return out + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, size, offset, 0)


def test_zip64_end_records_are_held_to_their_locator(tmp_path):
    data = _npz_bytes(tmp_path, a=np.arange(3), b=np.ones(2), c=np.zeros(1))
    good = _with_zip64_end(data)
    assert sorted(_open_bytes(tmp_path, good).keys()) == ["a", "b", "c"]
    with pytest.raises(tensorwire.MalformedError):
        _open_bytes(tmp_path, _with_zip64_end(data, count=2))
    # A copy of the locator and a planted end record in the archive comment: the
    # copied locator points at a record that does not end where it starts.
    fake = good[-42:-22] + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0, 0, 0, 0, 0)
    planted = bytearray(good)
    planted[-2:] = struct.pack("<H", len(fake))
    with pytest.raises(tensorwire.MalformedError, match="ZIP64 end record"):
        _open_bytes(tmp_path, bytes(planted) + fake)


def _npz_bytes(tmp_path, compressed=False, **arrays):
    path = str(tmp_path / "src.npz")
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return bytearray(open(path, "rb").read())


def _open_bytes(tmp_path, data, name="bad.npz"):
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return tensorwire.open(str(path))


def test_npz_directories_that_disagree_are_refused(tmp_path):
    two = dict(x=np.arange(3), y=np.ones(2))
    # The end record counting fewer members than the directory holds.
    data = _npz_bytes(tmp_path, **two)
    data[data.rfind(b"PK\x05\x06") + 10] = 1
    with pytest.raises(tensorwire.MalformedError, match="end record counts 1"):
        _open_bytes(tmp_path, data)
    # A directory record whose name is cut short.
    data = _npz_bytes(tmp_path, **two)
    data[data.rfind(b"PK\x01\x02") + 28] = 0
    with pytest.raises(tensorwire.MalformedError):
        _open_bytes(tmp_path, data)
    # A local header naming another member than the directory does.
    data = _npz_bytes(tmp_path, **two)
    data[30:35] = b"q.npy"
    with pytest.raises(tensorwire.MalformedError, match="is called `q.npy`"):
        _open_bytes(tmp_path, data)


def test_npz_digests_and_sizes_are_checked(tmp_path):
    # A zeroed CRC is a mismatch (numpy's zipfile always writes one).
    data = _npz_bytes(tmp_path, x=np.arange(3))
    data[data.rfind(b"PK\x01\x02") + 16:data.rfind(b"PK\x01\x02") + 20] = b"\0" * 4
    with pytest.raises(tensorwire.ChecksumError):
        _open_bytes(tmp_path, data).verify()
    # A deflated member claiming 4 GiB: its array reads, and verify() refuses the
    # size before allocating anything (deflate cannot expand that much).
    data = _npz_bytes(tmp_path, compressed=True, x=np.arange(3.0))
    cd = data.rfind(b"PK\x01\x02")
    data[cd + 24:cd + 28] = (0xFFFFFFF0).to_bytes(4, "little")
    r = _open_bytes(tmp_path, data)
    np.testing.assert_array_equal(r["x"], np.arange(3.0))
    with pytest.raises(tensorwire.DecodeError, match="cannot come from"):
        r.verify()


def test_npz_members_whose_crc_fails_stop_convert_and_copies(tmp_path):
    # One bit of a stored member's array flipped: np.load refuses the member.
    data = _npz_bytes(tmp_path, w=np.arange(8, dtype="<f4"), b=np.ones(3))
    at = data.find(np.arange(8, dtype="<f4").tobytes())
    data[at + 2] ^= 0x40
    bad = _open_bytes(tmp_path, data, "crc_bad.npz")
    with pytest.raises(Exception, match="CRC"):
        np.load(str(tmp_path / "crc_bad.npz"))["w"]
    dst = str(tmp_path / "out.zt")
    with pytest.raises(tensorwire.ChecksumError, match="w.npy"):
        tensorwire.convert(str(tmp_path / "crc_bad.npz"), dst)
    assert not os.path.exists(dst)
    with pytest.raises(tensorwire.ChecksumError):
        bad.read_numpy("w", copy=True)
    np.testing.assert_array_equal(bad.read_numpy("b", copy=True), np.ones(3))
    with pytest.raises(tensorwire.ChecksumError):
        bad.read_into("w", np.empty(8, np.float64))  # a cast: numpy copies it
    # Every copy of a stored member's bytes checks: a byte swap, a gather, and the
    # copy torch needs of an unaligned member (np.savez puts arrays at odd offsets).
    for arr in (np.arange(8, dtype=">f4"), np.asfortranarray(np.arange(8, dtype=">f8").reshape(2, 4))):
        data = _npz_bytes(tmp_path, w=arr)
        data[data.find(arr.tobytes(order="A")) + 2] ^= 0x40
        swapped = _open_bytes(tmp_path, data, "crc_bad_copy.npz")
        with pytest.raises(tensorwire.ChecksumError):
            swapped.read_numpy("w")
    try:
        import torch  # noqa: F401
    except ImportError:
        torch = None
    if torch is not None:
        with pytest.raises(tensorwire.ChecksumError):
            bad.read_torch("w")
    # A write to a zero-copy array (a private map) is not damage: a copy reads it,
    # and the CRC is checked against the file's bytes.
    good = _open_bytes(tmp_path, _npz_bytes(tmp_path, w=np.arange(8, dtype="<f4")), "crc_good.npz")
    v = good.read_numpy("w")
    assert v.flags.writeable
    v[0] = 42
    assert good.read_numpy("w", copy=True)[0] == 42
    good.verify()
    # Zero-copy reads touch no byte, so they do not check (verify() does).
    assert bad["w"].shape == (8,)
    with pytest.raises(tensorwire.ChecksumError):
        bad.verify()
    # A deflated member is checked whenever it is inflated to its end.
    data = _npz_bytes(tmp_path, compressed=True, w=np.arange(8, dtype="<f4"))
    cd = data.rfind(b"PK\x01\x02")
    data[cd + 16] ^= 0x01
    with pytest.raises(tensorwire.ChecksumError):
        _open_bytes(tmp_path, data, "crc_bad_deflated.npz")["w"]


def _zip_without_utf8_flag(members):
    """A stored ZIP of `(name bytes, data)` members, general-purpose flags all clear."""
    out, central = bytearray(), []
    for name, data in members:
        crc, offset = zlib.crc32(data), len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, crc, len(data),
                           len(data), len(name), 0) + name + data
        central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0, crc,
                                   len(data), len(data), len(name), 0, 0, 0, 0, 0, offset) + name)
    directory = b"".join(central)
    return bytes(out + directory + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members),
                                               len(members), len(directory), len(out), 0))


def test_npz_member_names_are_decoded_as_zipfile_decodes_them(tmp_path):
    # Without the UTF-8 flag names are code page 437, as np.load reads them.
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.arange(3.0))
    npy = buf.getvalue()
    for name in (b"m\x81.npy", "café.npy".encode(), bytes(range(128, 256)) + b".npy"):
        data = _zip_without_utf8_flag([(name, npy)])
        with np.load(io.BytesIO(data)) as want, _open_bytes(tmp_path, data) as got:
            assert got.keys() == want.files == [name[:-4].decode("cp437")]
            np.testing.assert_array_equal(got[want.files[0]], want[want.files[0]])


def test_npz_members_that_are_not_arrays_are_unsupported_stored_or_deflated(tmp_path):
    import zipfile
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        path = tmp_path / "mixed.npz"
        with zipfile.ZipFile(path, "w", compression=method) as z:
            z.writestr("a.npy", b"")
            z.writestr("readme.txt", b"hello")
        with pytest.raises(tensorwire.UnsupportedError, match="not an .npy array"):
            tensorwire.open(str(path))


def _npy(header, major=1, data=b""):
    text = header.encode() + b" " * (63 - (len(header) + 12) % 64) + b"\n"
    size = len(text).to_bytes(2 if major == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([major, 0]) + size + text + data


@pytest.mark.parametrize("header, major, error", [
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (02, 3), }", 1, "MalformedError"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3), }", 3, "MalformedError"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551615, 0), }", 1,
     "MalformedError"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 9223372036854775807, 3), }", 1,
     "MalformedError"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3), }", 1, None),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (00, 3), }", 1, None),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (0_0, 1_0), }", 1, None),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (1__0,), }", 1, "MalformedError"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (0_1,), }", 1, "MalformedError"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (3_,), }", 1, "MalformedError"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2 L, 3L L), }", 1, None),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2LL, 3), }", 1, "MalformedError"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2L_, 3), }", 1, "MalformedError"),
    # numpy's limit: the non-zero dimensions times the item size fit int64.
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4611686018427387903), }", 1,
     "MalformedError"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 1152921504606846975), }", 1, None),
])
@pytest.mark.filterwarnings("ignore")
def test_npy_headers_are_read_as_numpy_reads_them(tmp_path, header, major, error):
    data = _npy(header, major, np.arange(6, dtype="<f4").tobytes())
    path = tmp_path / "h.npy"
    path.write_bytes(data)
    try:
        want = np.load(str(path))
    except (ValueError, SyntaxError, tokenize.TokenError):  # the last from Python 3.12 on
        want = None
    assert (want is None) == (error is not None)
    if error is None:
        np.testing.assert_array_equal(tensorwire.open(str(path))["array"], want)
    else:
        with pytest.raises(getattr(tensorwire, error)):
            tensorwire.open(str(path))


def test_npy_minor_versions_are_unsupported(tmp_path):
    data = bytearray(_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                          data=b"\0" * 4))
    data[7] = 1
    with pytest.raises(tensorwire.UnsupportedError, match="version 1.1"):
        _open_bytes(tmp_path, data, "v11.npy")


@pytest.mark.parametrize("name", REFUSED)
def test_arrays_that_are_not_tensors_are_refused(name):
    with pytest.raises(tensorwire.UnsupportedError):
        tensorwire.open(os.path.join(NUMPY, name))


def _expected(path):
    with open(path.replace(".safetensors", ".expected.json")) as f:
        return json.load(f)


@pytest.mark.parametrize(
    "name", ["dtypes", "numpy", "metadata", "empty", "raw_types"]
)
def test_safetensors_fixtures_match_the_package_bytes(name):
    path = os.path.join(SAFETENSORS, name + ".safetensors")
    exp = _expected(path)
    with tensorwire.open(path) as r:
        assert r.format == "safetensors"
        assert sorted(r.keys()) == sorted(exp["tensors"])
        for key, t in exp["tensors"].items():
            raw = r.read_numpy(key).tobytes() if r.metadata(key).shape else r[key].tobytes()
            assert hashlib.sha256(raw).hexdigest() == t["sha256"], key
        assert r.attributes == (exp["metadata"] or {})


def test_safetensors_views_are_zero_copy_and_typed():
    r = tensorwire.open(os.path.join(SAFETENSORS, "dtypes.safetensors"))
    w = r["f32.weight"]
    assert isinstance(w.base, tensorwire.BytesOwner)
    assert w.shape == (4, 5) and w.dtype == np.float32
    assert r["scalar"].shape == () and r["scalar"] == 2.5
    assert r["empty"].shape == (0, 4)
    assert r["c64"].dtype == np.complex64


def test_safetensors_package_reads_the_same(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    path = os.path.join(SAFETENSORS, "numpy.safetensors")
    want = st.load_file(path)
    r = tensorwire.open(path)
    for key, value in want.items():
        np.testing.assert_array_equal(r[key], value)


def test_convert_writes_files_safetensors_reads(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    for src in ["fortran.npy", "big_endian.npy", "c_order.npy"]:
        dst = str(tmp_path / (src + ".safetensors"))
        assert tensorwire.convert(os.path.join(NUMPY, src), dst) == 1
        np.testing.assert_array_equal(st.load_file(dst)["array"], np.load(os.path.join(NUMPY, src)))


def test_convert_round_trips_package_files_byte_for_byte(tmp_path):
    src = os.path.join(SAFETENSORS, "dtypes.safetensors")
    dst = str(tmp_path / "copy.safetensors")
    tensorwire.convert(src, dst)
    with open(src, "rb") as a, open(dst, "rb") as b:
        assert a.read() == b.read()


def test_convert_to_zt_and_back(tmp_path):
    src = os.path.join(NUMPY, "compressed.npz")
    zt = str(tmp_path / "a.zt")
    assert tensorwire.convert(src, zt, compress=True, checksum="crc32c") == 18
    with np.load(src) as want, tensorwire.open(zt) as r:
        for key in want.files:
            np.testing.assert_array_equal(r[key], want[key])


def _big_npy(tmp_path):
    """A 20 MiB array: 2.5 of convert's 8 MiB progress steps."""
    src = str(tmp_path / "big.npy")
    np.save(src, np.arange(20 << 18, dtype=np.float32))
    return src


@pytest.mark.parametrize("dst", ["out.zt", "out.safetensors"])
def test_convert_reports_progress_within_a_large_tensor(tmp_path, dst):
    src, dst = _big_npy(tmp_path), str(tmp_path / dst)
    calls = []
    assert tensorwire.convert(src, dst, progress=lambda *a: calls.append(a)) == 1
    total = 20 << 20
    assert calls[-1] == (1, 1, total)
    inside = [c for c in calls if c[0] == 0 and 0 < c[2] < total]
    assert len(inside) == 2 and all(c[1] == 1 for c in calls)
    assert [c[2] for c in calls] == sorted(c[2] for c in calls)


@pytest.mark.parametrize("exc", [ValueError, KeyboardInterrupt])
def test_an_exception_in_progress_stops_convert_and_leaves_nothing(tmp_path, exc):
    """Raising from the callback (or Ctrl-C, whose KeyboardInterrupt arrives the same
    way) stops the conversion at the next 8 MiB and is raised; no file is left."""
    src = _big_npy(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    calls = []

    def stop(*args):
        calls.append(args)
        raise exc("stop")

    with pytest.raises(exc, match="stop"):
        tensorwire.convert(src, str(out / "x.zt"), progress=stop)
    assert len(calls) == 1 and os.listdir(out) == []


def test_convert_refuses_what_safetensors_cannot_hold(tmp_path):
    dst = str(tmp_path / "x.safetensors")
    with pytest.raises(tensorwire.UnsupportedError):
        tensorwire.convert(os.path.join(NUMPY, "arrays.npz"), dst)  # complex128
    with pytest.raises(tensorwire.InvalidArgumentError):
        tensorwire.convert(os.path.join(NUMPY, "c_order.npy"), dst, compress=True)
    with pytest.raises(tensorwire.InvalidArgumentError):
        tensorwire.convert(os.path.join(NUMPY, "c_order.npy"), dst, format="gguf")
    assert not os.path.exists(dst)


@pytest.mark.parametrize("version", [1, 2])
def test_raw_types_survive_a_trip_through_zt(tmp_path, version):
    """safetensors' F4 / F8_E8M0 go to .zt as raw bytes that remember their layout,
    and come back under their own types; GGUF blocks, which safetensors cannot hold,
    are refused on the way back as they are from the GGUF file itself."""
    src = os.path.join(SAFETENSORS, "raw_types.safetensors")
    zt, back = str(tmp_path / "raw.zt"), str(tmp_path / "back.safetensors")
    tensorwire.convert(src, zt, zt_version=version)
    tensorwire.convert(zt, back)
    with open(src, "rb") as a, open(back, "rb") as b:
        assert a.read() == b.read()
    blocks = str(tmp_path / "blocks.zt")
    tensorwire.convert(os.path.join(GGUF, "quantized.gguf"), blocks, zt_version=version)
    with pytest.raises(tensorwire.UnsupportedError, match="gguf:"):
        tensorwire.convert(blocks, str(tmp_path / "blocks.safetensors"))
    assert not os.path.exists(tmp_path / "blocks.safetensors")


@pytest.mark.parametrize("version", [1, 2])
def test_zt_logical_types_without_a_dtype_are_kept_or_refused(tmp_path, version):
    """A .zt tensor typed f8_e8m0 or with a user's own type keeps its type when
    converted to .zt (either version); to safetensors, f8_e8m0 becomes F8_E8M0 and a
    type safetensors lacks is refused, never written as its storage integers."""
    src = str(tmp_path / "typed.zt")
    with tensorwire.Writer(src, version=version) as w:
        w.write("e8", tensorwire.Tensor({"data": np.arange(6, dtype=np.uint8)}, shape=[2, 3],
                                        type="f8_e8m0"))
        w.write("mine", tensorwire.Tensor({"data": np.arange(4, dtype=np.uint16)}, shape=[4],
                                          type="my_type"))
    for out_version in (1, 2):
        dst = str(tmp_path / f"out{out_version}.zt")
        tensorwire.convert(src, dst, zt_version=out_version)
        with tensorwire.Reader(dst) as r:
            assert {k: r.metadata(k).type for k in r.keys()} == {"e8": "f8_e8m0",
                                                                 "mine": "my_type"}
            assert r.read("e8").components["data"].tobytes() == bytes(range(6))
    st = str(tmp_path / "typed.safetensors")
    with pytest.raises(tensorwire.UnsupportedError, match="my_type"):
        tensorwire.convert(src, st)
    assert not os.path.exists(st)
    only_e8 = str(tmp_path / "e8.zt")
    with tensorwire.Writer(only_e8, version=version) as w:
        w.write("e8", tensorwire.Tensor({"data": np.arange(6, dtype=np.uint8)}, shape=[2, 3],
                                        type="f8_e8m0"))
    tensorwire.convert(only_e8, st)
    with tensorwire.Reader(st) as r:
        assert r.metadata("e8").attributes == {"safetensors.dtype": "F8_E8M0",
                                               "safetensors.shape": [2, 3]}
        assert r.read_numpy("e8").tobytes() == bytes(range(6))


def test_gguf_lengths_past_the_end_of_a_small_file_are_truncation():
    # A string claiming 512 MiB or 2 GiB of a 64-byte file: cut short, whether or not
    # the claim passes the header limit.
    def gguf_with_string_length(n):
        kv = struct.pack("<Q", 1) + b"k" + struct.pack("<I", 8) + struct.pack("<Q", n) + b"abc"
        return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv
    for n in (512 << 20, 2 << 30, 1 << 62):
        with pytest.raises(tensorwire.TruncatedError):
            tensorwire.Reader(buffer=gguf_with_string_length(n))
    many_pairs = b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 62)
    with pytest.raises(tensorwire.TruncatedError):
        tensorwire.Reader(buffer=many_pairs)


def test_gguf_string_values_that_are_not_utf8_read_as_bytes(tmp_path):
    # The spec asks for UTF-8, but llama.cpp and gguf-py keep a value's bytes: a raw
    # byte in a vocabulary must not make the tensors unreadable.
    def gstr(b):
        return struct.pack("<Q", len(b)) + b
    kv = gstr(b"tok") + struct.pack("<I", 8) + gstr(b"a\xff")
    kv += gstr(b"vocab") + struct.pack("<IIQ", 9, 8, 2) + gstr(b"ok") + gstr(b"\xc3")
    info = gstr(b"t") + struct.pack("<IQIQ", 1, 4, 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 2) + kv + info
    path = tmp_path / "raw.gguf"
    path.write_bytes(head + bytes(-len(head) % 32) + np.arange(4, dtype=np.float32).tobytes())
    r = tensorwire.Reader(str(path))
    assert r.attributes == {"tok": b"a\xff", "vocab": ["ok", b"\xc3"]}
    np.testing.assert_array_equal(r.read_numpy("t"), np.arange(4, dtype=np.float32))
    tensorwire.convert(str(path), str(tmp_path / "raw.zt"))
    assert tensorwire.Reader(str(tmp_path / "raw.zt")).attributes == r.attributes
    # A key that is not UTF-8 is still malformed.
    bad_key = head.replace(gstr(b"tok"), gstr(b"t\xff\xfe"))
    with pytest.raises(tensorwire.MalformedError, match="UTF-8"):
        tensorwire.Reader(buffer=bad_key + bytes(-len(bad_key) % 32) + bytes(16))


def test_gguf_reads_what_the_gguf_package_reads():
    gguf = pytest.importorskip("gguf")
    for name in ["plain.gguf", "quantized.gguf"]:
        path = os.path.join(GGUF, name)
        want = gguf.GGUFReader(path)
        r = tensorwire.open(path)
        assert r.format == "gguf"
        for t in want.tensors:
            got = r[t.name]
            np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), np.asarray(t.data).reshape(-1).view(np.uint8))
            assert r.metadata(t.name).attributes["gguf.type"] == t.tensor_type.name
        assert r.attributes["general.architecture"] == "tensorwire-test"


def test_attributes_are_new_containers_of_values_converted_once():
    r = tensorwire.open(os.path.join(GGUF, "plain.gguf"))
    first = r.attributes
    lists = [k for k, v in first.items() if isinstance(v, list) and v]
    assert lists
    first["general.architecture"] = "changed"
    del first["test.u8"]
    first["test.nested_i32"][0].append(99)          # an inner list
    for key in lists:
        first[key].append("extra")
        first[key][0] = "changed"
    second = r.attributes
    assert second is not first
    assert second["general.architecture"] == "tensorwire-test"
    assert "test.u8" in second
    for key in lists:
        assert second[key] is not first[key]
        assert "extra" not in second[key] and second[key][0] != "changed"
    assert 99 not in second["test.nested_i32"][0]
    r.close()
    with pytest.raises(tensorwire.InvalidArgumentError):
        r.attributes


@pytest.mark.parametrize(
    "path",
    [os.path.join(NUMPY, "arrays.npz"), os.path.join(SAFETENSORS, "dtypes.safetensors"),
     os.path.join(NUMPY, "fortran.npy")],
    ids=os.path.basename,
)
def test_truncated_files_raise_format_errors(tmp_path, path):
    data = open(path, "rb").read()
    for cut in [1, 9, len(data) // 2, len(data) - 1]:
        p = tmp_path / "cut"
        p.write_bytes(data[:cut])
        with pytest.raises(tensorwire.FormatError):
            tensorwire.open(str(p))
