"""The unit tables on disk: ``luts/*.bin`` and ``luts/manifest.json``, and their one loader.

Every table is a little-endian int32 array. ``manifest.json`` records, for each unit, its
file, dtype, shape, index formula and SHA-256, and one ``manifest_sha256`` that identifies
the whole unit set (it is part of a run's identity). That hash is the SHA-256 of the UTF-8
text made of one line per unit, in sorted unit-name order::

    "<name> <file> <dtype> <shape joined by x> <sha256>\\n"

so that JS can recompute it without a canonical-JSON library.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from daisychain.units import reference as ref

MANIFEST = "manifest.json"
DTYPE = "<i4"
UNIT_INDEX = {
    "mul": "(a + 128) * 256 + (b + 128)",
    "requantize": "x + 32768 (x = 16-bit routed accumulator, see docs/UNITS.md)",
    "relu": "x + 128",
    "exp": "z + 128 (z = int8, 4 fractional bits; value = round(32768 * exp(min(z, 0) / 16)))",
}
UNIT_SHAPE = {"mul": (ref.MUL_SIZE,), "requantize": (ref.RQ_SIZE,), "relu": (ref.RELU_SIZE,)}
#: units added after format 1, listed under "extra_units": each is hash-checked on load like
#: the others, but left out of manifest_sha256, so the identity of every run that does not
#: use them is unchanged; a run whose model uses one names its SHA-256 in its identity
#: (docs/ENGINE.md, "The exp unit")
EXTRA_SHAPE = {"exp": (ref.EXP_SIZE,)}


class LutError(Exception):
    """A table or the manifest is missing, malformed or does not match its hash."""


def default_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "luts"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_hash(units: dict) -> str:
    lines = "".join(
        f"{name} {u['file']} {u['dtype']} {'x'.join(str(s) for s in u['shape'])} {u['sha256']}\n"
        for name, u in sorted(units.items())
    )
    return sha256_hex(lines.encode("utf-8"))


def table_bytes(table: np.ndarray) -> bytes:
    return np.ascontiguousarray(table, dtype=DTYPE).tobytes()


def build_manifest(tables: dict[str, np.ndarray], provenance: dict | None = None) -> dict:
    units, extra = {}, {}
    for name in sorted(tables):
        t = np.asarray(tables[name])
        (extra if name in EXTRA_SHAPE else units)[name] = {
            "file": f"{name}.bin",
            "dtype": DTYPE,
            "shape": list(t.shape),
            "index": UNIT_INDEX[name],
            "sha256": sha256_hex(table_bytes(t)),
        }
    manifest = {"format": 1, "units": units, "manifest_sha256": manifest_hash(units)}
    if extra:
        manifest["extra_units"] = extra
    if provenance:
        manifest["provenance"] = provenance
    return manifest


def write_luts(tables: dict[str, np.ndarray], out_dir: Path, provenance: dict | None = None) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = build_manifest(tables, provenance)
    for name, u in {**manifest["units"], **manifest.get("extra_units", {})}.items():
        (out_dir / u["file"]).write_bytes(table_bytes(tables[name]))
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


@dataclass(frozen=True)
class LutSet:
    """The verified unit tables, loaded and hash-checked."""

    mul: np.ndarray  #: int32[65536]
    requantize: np.ndarray  #: int32[65536]
    relu: np.ndarray  #: int32[256]
    exp: np.ndarray  #: int32[256], the softmax's exp unit (an extra unit)
    manifest: dict
    directory: Path

    @property
    def manifest_sha256(self) -> str:
        return self.manifest["manifest_sha256"]

    @property
    def exp_sha256(self) -> str:
        """The exp table's SHA-256: in the identity of a run whose model reads it."""
        return self.manifest["extra_units"]["exp"]["sha256"]

    def tables(self) -> dict[str, np.ndarray]:
        return {"mul": self.mul, "requantize": self.requantize, "relu": self.relu, "exp": self.exp}


def read_manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise LutError(f"{path}: missing (run `daisychain export-luts`)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LutError(f"{path}: not valid JSON ({exc})") from None
    units = manifest.get("units") if isinstance(manifest, dict) else None
    if not isinstance(units, dict) or set(units) != set(UNIT_SHAPE):
        raise LutError(f"{path}: must describe exactly the units {sorted(UNIT_SHAPE)}")
    extra = manifest.get("extra_units")
    if not isinstance(extra, dict) or set(extra) != set(EXTRA_SHAPE):
        raise LutError(f"{path}: must describe exactly the extra units {sorted(EXTRA_SHAPE)} "
                       f"(run `daisychain export-luts`)")
    shapes = {**UNIT_SHAPE, **EXTRA_SHAPE}
    for name, u in {**units, **extra}.items():
        if not isinstance(u, dict) or not all(k in u for k in ("file", "dtype", "shape", "sha256")):
            raise LutError(f"{path}: entry {name!r} lacks file/dtype/shape/sha256")
        if u["dtype"] != DTYPE or tuple(u["shape"]) != shapes[name]:
            raise LutError(f"{path}: {name} must be {DTYPE} of shape {shapes[name]}")
        if Path(u["file"]).name != u["file"]:
            raise LutError(f"{path}: {name} file name {u['file']!r} must be a plain name")
    if manifest.get("manifest_sha256") != manifest_hash(units):
        raise LutError(f"{path}: manifest_sha256 does not match its entries")
    return manifest


def load_luts(directory: str | Path | None = None) -> LutSet:
    """Load every table, verify its SHA-256 against the manifest, and return them.

    Raises :class:`LutError` naming the first file that is missing or whose hash differs.
    """
    directory = Path(directory) if directory is not None else default_dir()
    if directory == default_dir() and _CACHE.get(directory) is not None:
        return _CACHE[directory]
    manifest = read_manifest(directory)
    tables = {}
    for name, u in {**manifest["units"], **manifest["extra_units"]}.items():
        path = directory / u["file"]
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise LutError(f"{path}: missing table for unit {name!r}") from None
        got = sha256_hex(data)
        if got != u["sha256"]:
            raise LutError(f"{path}: SHA-256 {got} does not match the manifest's {u['sha256']} "
                           f"(table for unit {name!r} is corrupt or was changed)")
        tables[name] = np.frombuffer(data, dtype=DTYPE).astype(np.int32)
    lut = LutSet(manifest=manifest, directory=directory, **tables)
    if directory == default_dir():
        _CACHE[directory] = lut
    return lut


_CACHE: dict[Path, LutSet] = {}
