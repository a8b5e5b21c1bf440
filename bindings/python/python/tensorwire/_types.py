"""Plain-Python value classes: TensorMetadata and Tensor (ztensor 1.x compatible)."""

from __future__ import annotations

_PRIMARY = {"dense": "data", "sparse_csr": "values", "sparse_coo": "values"}


def primary_role(format: str, roles) -> str | None:
    """The component that carries an object's element type."""
    roles = list(roles)
    wanted = _PRIMARY.get(format, "packed_weight")
    if wanted in roles:
        return wanted
    return roles[0] if roles else None


class TensorMetadata:
    """What a file says about one tensor, without reading its data.

    Attributes:
        name: tensor name.
        dtype: numpy-style storage dtype name of the primary component
            ("float32", "bfloat16", "uint8" for float8, "float32" for complex64).
        type: logical type ("complex64", "f8_e4m3fn") or None.
        shape: list of ints ([] for a 0-d scalar).
        format: "dense", "sparse_csr", "sparse_coo", "quantized_group", ...
        components: {role: {dtype, type, offset, length, encoding,
            uncompressed_length, digest}}.
        attributes: per-tensor attributes (dict) or None.
    """

    __slots__ = ("name", "dtype", "type", "shape", "format", "components", "attributes")

    def __init__(self, name, dtype, shape, format, *, type=None, components=None,
                 attributes=None):
        self.name = name
        self.dtype = dtype
        self.type = type
        self.shape = list(shape)
        self.format = format
        self.components = components
        self.attributes = attributes

    def __eq__(self, other):
        if not isinstance(other, TensorMetadata):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __repr__(self):
        extra = f" type='{self.type}'" if self.type is not None else ""
        return (f"<TensorMetadata name='{self.name}' shape={self.shape} "
                f"dtype='{self.dtype}'{extra}>")


class Tensor:
    """A tensor with all its components (one ``data`` array for dense tensors;
    ``values``/``indices``/``indptr`` for sparse_csr, ``packed_weight``/``scales``/...
    for quantized_group).

    Example::

        Tensor({"data": arr})
        Tensor({"values": v, "indices": i, "indptr": p}, shape=[4096, 4096],
               format="sparse_csr")
    """

    __slots__ = ("shape", "dtype", "type", "format", "components", "attributes")

    def __init__(self, components, *, shape=None, dtype=None, format="dense", type=None,
                 attributes=None):
        if not isinstance(components, dict):
            raise TypeError("components must be a dict {role: array}")
        if shape is not None:
            self.shape = [int(d) for d in shape]
        elif format == "dense" and "data" in components:
            self.shape = list(components["data"].shape)
        elif format == "dense":
            raise ValueError("a dense tensor needs a 'data' component or an explicit shape")
        else:
            raise ValueError(f"a {format} tensor needs an explicit shape")
        if dtype is None:
            primary = primary_role(format, components)
            if primary is None:
                raise ValueError("cannot infer the dtype of a tensor without components")
            dtype = components[primary].dtype
        self.dtype = str(dtype)
        self.type = type
        self.format = format
        self.components = dict(components)
        self.attributes = dict(attributes) if attributes is not None else None

    def numpy(self):
        """The dense tensor as a numpy array (the ``data`` component)."""
        if self.format != "dense":
            raise TypeError(f"numpy() needs a dense tensor, this one is {self.format}")
        return self.components["data"]

    def torch(self, *, device="cpu"):
        """The dense tensor as a torch.Tensor (sharing memory on the CPU, unless the
        array is read-only: torch has no read-only tensors, so then it is a copy)."""
        from . import _staging, _torch

        return _staging.numpy_to(_torch, self.numpy(), device)

    def __repr__(self):
        return (f"<tensorwire.Tensor shape={self.shape} dtype='{self.dtype}' "
                f"format='{self.format}'>")
