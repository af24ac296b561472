"""The types every data loader shares: :class:`Dataset` (its arrays, its header and the
"DCDS" bytes whose SHA-256 is the dataset fingerprint), :class:`DataError`, the task names,
and the offline switches a loader sets around Hugging Face ``datasets``.

The loaders import this module and not each other's: ``data.py`` (digits, text, and the
task dispatch), ``images.py``, ``sources.py`` and ``hub.py``.

DCDS format: ``b"DCDS"``, u32 LE header length, the header (canonical JSON, UTF-8), then
the arrays named in ``header["arrays"]`` in that order, each raw little-endian, row-major.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field

import numpy as np

from daisychain.engine.spec import dumps_canonical

TASKS = ("digits", "text", "image")
#: what each task's embedded default is, in words (the page's data list)
EMBEDDED_NAMES = {"digits": "handwritten digits (8x8)", "text": "the Zen of Python (characters)",
                  "image": "MNIST handwritten digits (28x28)"}
ARRAYS = ("x_train", "y_train", "x_test", "y_test")
MAGIC = b"DCDS"


class DataError(ValueError):
    """A dataset that cannot be loaded or used, with a message saying why."""


@dataclass
class Dataset:
    task: str
    x_train: np.ndarray  #: dense: float64 (N, F); tokens: int32 (N, context); image: uint8 (N, C*H*W)
    y_train: np.ndarray  #: int32 (N,)
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    meta: dict = field(default_factory=dict)
    _bytes: bytes | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        if self.x_train.dtype == np.uint8:
            return "image"
        return "tokens" if self.x_train.dtype.kind == "i" else "dense"

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """An image dataset's (channels, height, width): ``meta["image_shape"]``; its x rows
        are the uint8 pixels, channel-major (c*H*W + y*W + x)."""
        c, h, w = (int(v) for v in self.meta["image_shape"])
        return c, h, w

    def header(self) -> dict:
        return {"format": 1, "task": self.task, "kind": self.kind, "classes": self.classes,
                "meta": self.meta,
                "arrays": [{"name": n, "dtype": getattr(self, n).dtype.str,
                            "shape": list(getattr(self, n).shape)} for n in ARRAYS]}

    def to_bytes(self) -> bytes:
        if self._bytes is None:
            head = dumps_canonical(self.header()).encode()
            parts = [MAGIC, struct.pack("<I", len(head)), head]
            parts += [np.ascontiguousarray(getattr(self, n)).tobytes() for n in ARRAYS]
            self._bytes = b"".join(parts)
        return self._bytes

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @staticmethod
    def from_bytes(data: bytes) -> "Dataset":
        try:
            if data[:4] != MAGIC:
                raise DataError("not a DaisyChain dataset (bad magic)")
            (n,) = struct.unpack_from("<I", data, 4)
            head = json.loads(data[8:8 + n])
            off = 8 + n
            arrays = {}
            for a in head["arrays"]:
                dt = np.dtype(a["dtype"])
                if dt.str not in ("<f8", "<i4", "|u1"):
                    raise DataError(f"array {a['name']}: unsupported dtype {a['dtype']}")
                count = int(np.prod(a["shape"]))
                arrays[a["name"]] = np.frombuffer(data, dt, count, off).reshape(a["shape"]).copy()
                off += count * dt.itemsize
            if off != len(data):
                raise DataError("dataset has trailing or missing bytes")
            return Dataset(head["task"], classes=int(head["classes"]), meta=head["meta"],
                           **{k: arrays[k] for k in ARRAYS})
        except (KeyError, ValueError, struct.error, TypeError, RecursionError) as exc:
            if isinstance(exc, DataError):
                raise
            raise DataError(f"malformed dataset bytes: {str(exc)[:300]}") from None


OFFLINE_SWITCHES = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
#: the switches load_text_source turned on itself (not the user): a --stream read lifts them
#: for its own time (engine/hub.py)
OWN_OFFLINE: set[str] = set()
