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
        bfloat16, float8 and complex need no ml_dtypes).

        The dtypes tensorwire has none for go as ``convert`` writes a checkpoint's:
        in version 2, ``float8_e8m0fnu`` as ``f8_e8m0`` and ``float4_e2m1fn_x2`` as
        ``f4_e2m1`` (its last dimension doubled; torch and version 2 both put the
        first value in the low nibble); otherwise (version 1, complex32, a 0-d float4
        pair) as the elements holding them with the attribute
        ``tensorwire.layout = "pytorch:<dtype>"``. ``read_torch`` gives every one of
        them back as torch's dtype."""
        from ._torch import torch_only_holder, torch_to_bytes

        held = torch_only_holder(data)
        if held is not None:
            self._write_torch_only(name, *held, compress=compress, checksum=checksum,
                                   attributes=attributes)
            return
        raw, dtype, shape = torch_to_bytes(data)
        if dtype.startswith("safetensors:"):
            raise TypeError(f"torch dtype {data.dtype} cannot be stored in a .zt file")
        self._write_raw(name, raw, dtype, shape, compress=compress, checksum=checksum,
                        attributes=attributes)

    def _write_torch_only(self, name, holder, layout, *, compress, checksum, attributes):
        v2_type = _V2_TYPES.get(layout) if self.version == 2 else None
        if v2_type is not None and (holder.ndim or v2_type == "f8_e8m0"):
            from ._types import Tensor

            shape = list(holder.shape)
            if v2_type == "f4_e2m1":  # f4_e2m1 counts single values; torch counts pairs
                shape = _native.float4_pairs_as_values(shape)
            tensor = Tensor({"data": holder.reshape(-1)}, shape=shape, type=v2_type,
                            attributes=attributes)
            self.write(name, tensor, compress=compress, checksum=checksum)
            return
        attrs = dict(attributes or {})
        attrs["tensorwire.layout"] = layout
        self.write_numpy(name, holder, compress=compress, checksum=checksum, attributes=attrs)

    def __repr__(self):
        return _native.Writer.__repr__(self)


# A PyTorch checkpoint's layouts (torch-only dtypes) that .zt version 2 has types for.
_V2_TYPES = {"pytorch:float8_e8m0fnu": "f8_e8m0", "pytorch:float4_e2m1fn_x2": "f4_e2m1"}
