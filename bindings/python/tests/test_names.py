"""Lookups by name: the strs keys() hands out are recognised by identity when read in
order; every other way of naming a tensor gives the same arrays."""

import random

import numpy as np
import pytest

import tensorwire as tw


@pytest.fixture(params=["zt", "safetensors"])
def many(request, tmp_path):
    data = {f"layer.{i:02d}.weight": np.full((3, i + 1), i, np.float32) for i in range(24)}
    zt = str(tmp_path / "many.zt")
    with tw.Writer(zt) as w:
        for name, arr in data.items():
            w.add(name, arr)
    if request.param == "zt":
        return zt, data
    path = str(tmp_path / "many.safetensors")
    tw.convert(zt, path)
    return path, data


def fresh(name):
    """An equal str that is a different object."""
    copy = "".join(list(name))
    assert copy == name and copy is not name
    return copy


def check(arr, data, name):
    assert arr.shape == data[name].shape and np.array_equal(arr, data[name]), name


def test_every_order_and_every_str_gives_the_same_arrays(many):
    path, data = many
    r = tw.Reader(path)
    keys = r.keys()
    assert sorted(keys) == sorted(data)
    for k in keys:  # in order
        check(r.read_numpy(k), data, k)
    for k in reversed(keys):  # backwards: never the expected position
        check(r[k], data, k)
    shuffled = list(keys)
    random.Random(0).shuffle(shuffled)
    for k in shuffled:
        check(r[k], data, k)
        check(r[k], data, k)  # the same name twice in a row
        check(r[fresh(k)], data, k)
    for k in keys:
        check(r.read_numpy(fresh(k)), data, k)
    both = r.read_numpy([keys[3], fresh(keys[1])])
    assert set(both) == {keys[1], keys[3]}
    for k, v in both.items():
        check(v, data, k)
    assert keys[5] in r and fresh(keys[5]) in r and "nope" not in r and 5 not in r


def test_keys_are_a_new_list_each_time(many):
    path, data = many
    r = tw.Reader(path)
    keys = r.keys()
    assert r.keys() is not keys and r.keys() == keys
    # Changing the caller's list changes nothing the reader answers.
    keys[0], keys[1] = keys[1], keys[0]
    check(r[keys[0]], data, keys[0])
    check(r[keys[1]], data, keys[1])
    keys[2] = "not.a.tensor"
    with pytest.raises(tw.TensorNotFoundError):
        r[keys[2]]
    assert r.keys()[0] != keys[0]


def test_unknown_and_wrong_type_names(many):
    path, _ = many
    r = tw.Reader(path)
    r.keys()
    with pytest.raises(KeyError):
        r["layer.99.weight"]
    with pytest.raises(TypeError):
        r.read_numpy(3)
    with pytest.raises(TypeError):
        r[b"layer.00.weight"]
    with pytest.raises(tw.TensorNotFoundError):
        r.read_numpy(["layer.00.weight", "missing"])


def test_closed_reader_refuses_names_from_keys(many):
    path, data = many
    r = tw.Reader(path)
    keys = r.keys()
    kept = r[keys[0]]
    r.close()
    with pytest.raises(tw.TensorwireError):
        r[keys[1]]
    with pytest.raises(tw.TensorwireError):
        r.keys()
    check(kept, data, keys[0])
