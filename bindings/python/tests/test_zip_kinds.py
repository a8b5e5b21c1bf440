"""ZIP archives that are neither torch checkpoints nor NPZ archives are named as such."""

import zipfile

import pytest

import tensorwire


def _zip(path, names):
    # Written by zipfile, not numpy or torch: the first record does not say what it is.
    with zipfile.ZipFile(path, "w") as z:
        for name in names:
            z.writestr(name, b"{}")
    return str(path)


def test_a_torch_export_package_is_named_as_one(tmp_path):
    # The records of a `torch.export.save` package (torch 2.15), without a data.pkl.
    path = _zip(tmp_path / "model.pt2", [
        "exported/data/weights/weight_0", "exported/models/model.json",
        "exported/archive_format", "exported/archive_version", "exported/byteorder"])
    with pytest.raises(tensorwire.UnsupportedError, match="torch.export package"):
        tensorwire.open(path)


def test_a_zip_of_other_files_is_neither_a_checkpoint_nor_an_npz(tmp_path):
    path = _zip(tmp_path / "docs.zip", ["docs/readme.txt", "docs/conf.json"])
    with pytest.raises(tensorwire.UnsupportedError, match="neither a torch checkpoint"):
        tensorwire.open(path)


def test_top_level_members_without_the_npy_suffix_still_read_as_npz(tmp_path):
    import io

    import numpy as np
    buf = io.BytesIO()
    np.save(buf, np.arange(3, dtype=np.int16))
    path = tmp_path / "plain.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("weights", buf.getvalue())
    with tensorwire.open(str(path)) as r:
        np.testing.assert_array_equal(r["weights"], np.arange(3, dtype=np.int16))
