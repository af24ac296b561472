"""--task image data (daisychain/engine/images.py): every source gives the same Dataset
layout, and bad data is refused with one line before anything trains. Unit tier: files the
tests write in tmp_path; nothing downloads."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from daisychain.engine import images
from daisychain.engine.data import Dataset, DataError, prepare_task

ROOT = Path(__file__).resolve().parents[2]


def _png(arr: np.ndarray, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


def _digits(n: int, h: int = 8, w: int = 8, c: int | None = None, seed: int = 0):
    rng = np.random.default_rng(seed)
    shape = (n, h, w) if c is None else (n, h, w, c)
    return rng.integers(0, 256, shape, dtype=np.uint8), (np.arange(n) % 3).astype(np.uint8)


def _npz(path: Path, **arrays) -> Path:
    np.savez_compressed(path, **arrays)
    return path


def _keras(tmp_path: Path, c: int | None = None, h: int = 8, name: str = "set.npz", **override) -> Path:
    xtr, ytr = _digits(30, h, h, c)
    xte, yte = _digits(9, h, h, c, seed=1)
    arrays = {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte, **override}
    return _npz(tmp_path / name, **arrays)


def _refused(source, match: str, **kw):
    with pytest.raises(DataError, match=match) as exc:
        prepare_task("image", str(source), **kw)
    assert "\n" not in str(exc.value)
    return str(exc.value)


# ----------------------------------------------------------------------------- sources


def test_embedded_mnist_is_real_fixed_and_survives_dcds():
    ds = prepare_task("image")
    assert ds.kind == "image" and ds.image_shape == (1, 28, 28) and ds.classes == 10
    assert ds.x_train.shape == (8000, 784) and ds.x_test.shape == (2000, 784)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int32
    assert sorted(np.unique(ds.y_test)) == list(range(10))
    # real digits: ink in the middle, blank borders
    mean = ds.x_train.reshape(-1, 28, 28).mean(axis=0)
    assert mean[10:18, 10:18].mean() > 60 and mean[:2].mean() < 1
    assert ds.fingerprint == prepare_task("image").fingerprint
    back = Dataset.from_bytes(ds.to_bytes())
    assert back.fingerprint == ds.fingerprint and back.image_shape == (1, 28, 28)
    assert back.kind == "image"


def test_keras_npz_grey_and_rgb_32x32(tmp_path):
    ds = prepare_task("image", str(_keras(tmp_path)))
    assert ds.image_shape == (1, 8, 8) and ds.classes == 3 and len(ds.y_train) == 30
    xtr, _ = _digits(30, 8, 8)
    assert np.array_equal(ds.x_train, xtr.reshape(30, 64))

    rgb = prepare_task("image", str(_keras(tmp_path, c=3, h=32, name="cifar.npz")))
    assert rgb.image_shape == (3, 32, 32) and rgb.x_train.shape == (30, 3 * 32 * 32)
    xtr, _ = _digits(30, 32, 32, 3)
    # channel-major per sample: x[c*H*W + y*W + x] (torch's NCHW flattened)
    assert np.array_equal(rgb.x_train.reshape(30, 3, 32, 32), xtr.transpose(0, 3, 1, 2))


def test_rgb_images_with_equal_channels_are_grey_and_image_size_resizes(tmp_path):
    xtr, ytr = _digits(30, 8, 8)
    xte, yte = _digits(9, 8, 8, seed=1)
    path = _npz(tmp_path / "g.npz", x_train=np.repeat(xtr[..., None], 3, 3), y_train=ytr,
                x_test=np.repeat(xte[..., None], 3, 3), y_test=yte.reshape(-1, 1))
    ds = prepare_task("image", str(path))
    assert ds.image_shape == (1, 8, 8) and np.array_equal(ds.x_train, xtr.reshape(30, 64))
    big = prepare_task("image", str(path), image_size=16)
    assert big.image_shape == (1, 16, 16) and big.fingerprint != ds.fingerprint


def _folder(root: Path, sizes=((8, 8),), classes=("cat", "dog", "emu"), per=4, rgb=False, fmt="PNG"):
    rng = np.random.default_rng(3)
    for ci, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per):
            h, w = sizes[(ci * per + i) % len(sizes)]
            arr = rng.integers(0, 256, (h, w, 3) if rgb else (h, w), dtype=np.uint8)
            ext = ".png" if fmt == "PNG" else ".jpg"
            (root / name / f"{i:03d}{ext}").write_bytes(_png(arr, fmt))
    return root


def test_image_folder_png_jpeg_grey_rgb(tmp_path):
    ds = prepare_task("image", str(_folder(tmp_path / "grey")))
    assert ds.image_shape == (1, 8, 8) and ds.classes == 3
    assert len(ds.y_train) + len(ds.y_test) == 12 and len(ds.y_test) == 2
    assert ds.meta["labels"] == ["cat", "dog", "emu"]
    rgb = prepare_task("image", str(_folder(tmp_path / "rgb", rgb=True, fmt="JPEG")), image_size=32)
    assert rgb.image_shape == (3, 32, 32)
    # the same folder gives the same bytes (sorted walk, fixed split)
    assert prepare_task("image", str(tmp_path / "grey")).fingerprint == ds.fingerprint


def test_image_folder_with_train_and_test_folders(tmp_path):
    _folder(tmp_path / "s" / "train", per=3)
    _folder(tmp_path / "s" / "test", per=1)
    (tmp_path / "s" / "train" / "cat" / "notes.txt").write_text("not an image, skipped")
    ds = prepare_task("image", str(tmp_path / "s"))
    assert len(ds.y_train) == 9 and sorted(ds.y_test.tolist()) == [0, 1, 2]


def _table_rows(n=20, size=8, rgb=False):
    rng = np.random.default_rng(5)
    shape = (size, size, 3) if rgb else (size, size)
    return ([{"bytes": _png(rng.integers(0, 256, shape, dtype=np.uint8)), "path": None}
             for _ in range(n)], [i % 4 for i in range(n)])


def _write_parquet(path: Path, n=20, size=8, rgb=False, labels=None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    imgs, labs = _table_rows(n, size, rgb)
    pq.write_table(pa.table({"image": imgs, "label": labels or labs}), path)
    return path


def test_hf_parquet_and_arrow_files(tmp_path):
    import pyarrow as pa

    ds = prepare_task("image", str(_write_parquet(tmp_path / "train.parquet", rgb=True, size=32)))
    assert ds.image_shape == (3, 32, 32) and ds.classes == 4
    assert len(ds.y_train) == 16 and len(ds.y_test) == 4
    imgs, labs = _table_rows(12)
    table = pa.table({"img": imgs, "label": labs})
    with pa.ipc.new_stream(str(tmp_path / "d.arrow"), table.schema) as w:  # HF's cache format
        w.write_table(table)
    ds = prepare_task("image", str(tmp_path / "d.arrow"))
    assert ds.image_shape == (1, 8, 8) and len(ds.y_train) + len(ds.y_test) == 12


def test_hf_dataset_through_load_dataset(tmp_path):
    """A hub-layout folder (data/train-*.parquet, data/test-*.parquet) through
    datasets.load_dataset: its own train and test splits."""
    (tmp_path / "hub" / "data").mkdir(parents=True)
    _write_parquet(tmp_path / "hub" / "data" / "train-00000-of-00001.parquet", n=24)
    _write_parquet(tmp_path / "hub" / "data" / "test-00000-of-00001.parquet", n=8)
    ds = prepare_task("image", str(tmp_path / "hub"), cache_dir=str(tmp_path / "cache"))
    assert len(ds.y_train) == 24 and len(ds.y_test) == 8 and ds.image_shape == (1, 8, 8)


def test_hub_name_that_cannot_load_is_one_line(tmp_path):
    """(An invalid repo id, so that the test never reaches for the network. The reason is
    HFValidationError, or OfflineModeIsEnabled once a text load in the same process has put
    ``datasets`` offline.)"""
    _refused("no such/im ages!", "could not load image dataset 'no such/im ages!': (HFValidationError|ConnectionError)",
             cache_dir=str(tmp_path / "cache"))


# ----------------------------------------------------------------------------- refusals


def test_mixed_image_sizes_refused_unless_resized(tmp_path):
    root = _folder(tmp_path / "m", sizes=((8, 8), (9, 8)))
    _refused(root, "mixed image sizes: 8x8 .* and 9x8 .*--image-size")
    assert prepare_task("image", str(root), image_size=8).image_shape == (1, 8, 8)
    xtr, ytr = _digits(30, 8, 8)
    xte, yte = _digits(9, 9, 9)
    _refused(_npz(tmp_path / "m.npz", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte),
             "mixed image sizes: train 8x8, test 9x9")


def test_one_class_refused(tmp_path):
    _refused(_keras(tmp_path, y_train=np.zeros(30, np.uint8), y_test=np.zeros(9, np.uint8)),
             "one class")
    root = _folder(tmp_path / "one", classes=("only",))
    _refused(root, "at least two classes")


def test_labels_out_of_range_refused(tmp_path):
    _refused(_keras(tmp_path, name="a.npz", y_train=np.arange(30, dtype=np.int64) - 1),
             "y_train has labels out of range")
    _refused(_keras(tmp_path, name="b.npz", y_test=np.full(9, 7, np.uint8)),
             r"y_test has labels out of range: 7, but the training labels lie in \[0, 3\)")
    _refused(_keras(tmp_path, name="c.npz", y_train=np.full(30, 0.5)), "images must be uint8, labels integers")
    _refused(_write_parquet(tmp_path / "p.parquet", labels=[-1] * 20), "out of range")


def test_unreadable_files_refused(tmp_path):
    root = _folder(tmp_path / "u")
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    _refused(root, r"broken.png: not a readable image")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 garbage")
    _refused(bad, "not a readable .npz")
    _refused(_npz(tmp_path / "k.npz", x_train=np.zeros((2, 4, 4), np.uint8)), "no array 'y_train'")
    _refused(tmp_path / "missing.npz", "no such file or folder")
    (tmp_path / "x.csv").write_text("a,b\n")
    _refused(tmp_path / "x.csv", "unknown image data file type")
    # an object array (a pickle) is never loaded
    obj = tmp_path / "obj.npz"
    np.savez(obj, x_train=np.array([{"a": 1}], dtype=object), y_train=np.zeros(1), x_test=np.zeros(1),
             y_test=np.zeros(1))
    _refused(obj, "holds object")


def _bomb_png(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header claims width x height (a few dozen bytes)."""
    data = bytearray(_png(np.zeros((1, 1), np.uint8)))
    ihdr = data.index(b"IHDR")
    data[ihdr + 4:ihdr + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr:ihdr + 17])) & 0xFFFFFFFF
    data[ihdr + 17:ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


def test_decompression_bomb_refused_before_decoding(tmp_path):
    root = _folder(tmp_path / "b")
    (root / "cat" / "zzz.png").write_bytes(_bomb_png(60000, 60000))
    _refused(root, "zzz.png: .*decompression bomb")


def test_size_caps_refused(tmp_path, monkeypatch):
    """Over a cap: one line, whatever the source (the caps are lowered for the test)."""
    path = _keras(tmp_path)
    monkeypatch.setattr(images, "MAX_IMAGES", 20)
    _refused(path, "39 images, more than the cap of 20")
    _refused(_folder(tmp_path / "f", per=8), "more than the cap of 20 images")
    _refused(_write_parquet(tmp_path / "p.parquet", n=21), "21 rows, more than the cap of 20")
    monkeypatch.setattr(images, "MAX_IMAGES", 1000)
    monkeypatch.setattr(images, "MAX_PIXEL_BYTES", 64 * 30)
    _refused(path, "MiB of pixels")
    monkeypatch.setattr(images, "MAX_IMAGE_FILE_BYTES", 10)
    _refused(_folder(tmp_path / "g"), "more than the cap of 0 MiB for one image")


def test_npz_member_claiming_more_than_it_holds_is_refused(tmp_path):
    """A .npy header that claims a huge shape must not allocate it."""
    import zipfile

    path = tmp_path / "lie.npz"
    header = np.lib.format.header_data_from_array_1_0(np.zeros((2, 2), np.uint8))
    header["shape"] = (1 << 20, 1 << 20)
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    buf.write(b"\0" * 16)
    with zipfile.ZipFile(path, "w") as zf:
        for name in ("x_train", "y_train", "x_test", "y_test"):
            zf.writestr(f"{name}.npy", buf.getvalue())
    _refused(path, "claims 1099511627776 bytes of data in a")


def test_image_size_range_and_other_tasks(tmp_path):
    _refused(_keras(tmp_path), r"--image-size must lie in \[4, 128\]", image_size=2)
    with pytest.raises(DataError, match="--image-size applies to the image task"):
        prepare_task("digits", image_size=16)


def test_fingerprint_follows_the_pixels(tmp_path):
    a = prepare_task("image", str(_keras(tmp_path, name="a.npz")))
    xtr, _ = _digits(30)
    xtr[0, 0, 0] ^= 1
    b = prepare_task("image", str(_keras(tmp_path, name="a.npz", x_train=xtr)))
    assert a.fingerprint != b.fingerprint


def test_train_cli_refuses_bad_data_with_one_line(tmp_path):
    path = _keras(tmp_path, y_train=np.zeros(30, np.uint8))
    proc = subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--task", "image",
                           "--data", str(path), "--steps", "1", "--quiet"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "one class" in lines[0] and proc.stdout == ""
