"""tensorwire.Writer: the native writer plus write(Tensor) and write_torch."""

from __future__ import annotations

from . import _native


class Writer(_native.Writer):
    """Writes a .zt file (ztensor 1.2 format; ztensor 1.2.3 reads it), or with
    ``version=2`` the .zt version 2 format that ztensor 2.x reads (digests "xxh3" or
    "sha256" there; version 2 files cannot be appended to).

    ``Writer(path)`` creates (or on finish replaces) ``path``; ``Writer.append(path)``
    adds tensors to an existing file. Use it as a context manager: it finishes on
    success, and on an exception discards the new file (or rolls the append back).
    Without ``finish()`` nothing is kept.
    """

    def write(self, name, data, *, compress=None, checksum="none"):
        """Write a tensorwire.Tensor (any format: dense, sparse_csr, sparse_coo,
        quantized_group, ...) with its components, type and attributes."""
        if not hasattr(data, "components"):
            raise TypeError("write() takes a tensorwire.Tensor; use write_numpy for arrays")
        self._write_components(
            name, data.components, list(data.shape), data.format, data.type,
            data.attributes, compress=compress, checksum=checksum)

    def write_torch(self, name, data, *, compress=None, checksum="none", attributes=None):
        """Write a dense torch tensor (moved to the CPU and made contiguous if needed;
        bfloat16, float8 and complex need no ml_dtypes)."""
        from ._torch import torch_to_bytes

        raw, dtype, shape = torch_to_bytes(data)
        if dtype.startswith("safetensors:"):
            raise TypeError(f"torch dtype {data.dtype} cannot be stored in a .zt file")
        self._write_raw(name, raw, dtype, shape, compress=compress, checksum=checksum,
                        attributes=attributes)

    def __repr__(self):
        return _native.Writer.__repr__(self)
