"""``daisychain export RUN.pt --to model.safetensors | model.onnx``: a trained model that
leaves DaisyChain, and :func:`torch_model`, the same model as a ``torch.nn.Module``.

    daisychain export run.pt --to model.safetensors
    daisychain export run.pt --to model.onnx          # needs the onnx extra

The checkpoint is read with the checked, code-free loader of ``daisychain.engine.checkpoint``
(torch's weights-only unpickler, then every name, shape, dtype, finiteness and the parameter
hash); a file it refuses is reported in words and nothing is written. Output files are written
atomically (a temporary file next to them, then a rename).

What the INT8 engine computes with is, per weight (and embedding) tensor, int8 values ``q``
and one power-of-two scale ``2**e`` (``e = exponent(max|W|) - 7``); biases stay float and are
rounded into the accumulator per batch. The ``.safetensors`` file holds, for every parameter
``NAME`` of the checkpoint (``layers.I.weight``, ``layers.I.bias``, the torch names):

* ``NAME``: float32, the dequantized weight ``q * 2**e`` (a bias: its float value),
* ``NAME.int8`` and ``NAME.scale`` (weights and embeddings only): the exact int8 ``q`` and the
  float32 scalar ``2**e``, so ``NAME == NAME.int8 * NAME.scale`` exactly,

and in its metadata (string -> string) ``format``, ``model`` (the model spec as JSON),
``identity`` (the run identity as JSON: settings, dataset fingerprint, unit tables, engine),
``run_id``, ``step``, ``params_sha256``, ``task`` and, for a text model, ``vocab`` (the
character of each class: from the checkpoint, or for an older checkpoint of the embedded
text, from that text).

The ``.onnx`` file is :func:`torch_model`'s float forward traced by ``torch.onnx`` (input
``x``: float32 ``(batch, features)``, int64 token ids ``(batch, context)`` or uint8 pixels
``(batch, C*H*W)``, channel-major; output
``logits``), with the same metadata in its ``metadata_props``.

The float forward is not the engine's INT8 forward (no input quantization, no requantize
clamps), so its logits are close, not identical; the predicted classes agree on nearly every
sample (tests/engine/test_export.py measures it on the digits test set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from daisychain.engine.checkpoint import (MAX_BYTES, Checkpoint, CheckpointError,
                                          read_checkpoint_file)
from daisychain.engine.detmath import pow2, quant_exponent, quantize
from daisychain.engine.layers import torch_sequential
from daisychain.engine.model import ParamLayout
from daisychain.engine.spec import ModelSpec

FORMAT = "daisychain-export"
VERSION = "1"
SUFFIXES = (".safetensors", ".onnx")


class ExportError(ValueError):
    """A checkpoint that cannot be exported, or an output that cannot be written."""


# --------------------------------------------------------------------------- the tensors


def _read(path) -> Checkpoint:
    try:
        size = Path(path).stat().st_size
    except OSError as exc:
        raise ExportError(f"cannot read {path}: {exc.strerror or exc}") from None
    if size > MAX_BYTES:  # before reading: the loader would hold the whole file first
        raise ExportError(f"{path}: {size} bytes, more than a checkpoint may have "
                          f"({MAX_BYTES} bytes)")
    try:
        return read_checkpoint_file(path)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None


def quantized(spec: ModelSpec, theta: np.ndarray) -> dict[str, tuple[np.ndarray, int] | np.ndarray]:
    """name -> (int8 values, scale exponent) for weights and embeddings, name -> float64 for
    biases: exactly the quantization the INT8 engine's forward pass applies."""
    layout = ParamLayout(spec)
    out: dict = {}
    for name, v in zip(layout.names, layout.views(theta)):
        if name.endswith(".bias"):
            out[name] = np.array(v, np.float64)
        else:
            e = int(quant_exponent(np.abs(v).max()))
            out[name] = (quantize(v, e).astype(np.int8), e)
    return out


def float_tensors(spec: ModelSpec, theta: np.ndarray, weights: str = "int8") -> dict[str, np.ndarray]:
    """name -> float32 array: ``weights="int8"`` the dequantized ``q * 2**e`` (what the engine
    multiplies with), ``"master"`` the float64 master copy rounded to float32."""
    if weights == "master":
        layout = ParamLayout(spec)
        return {n: np.array(v, np.float32) for n, v in zip(layout.names, layout.views(theta))}
    if weights != "int8":
        raise ValueError("weights must be 'int8' or 'master'")
    out = {}
    for name, v in quantized(spec, theta).items():
        if isinstance(v, tuple):
            q, e = v
            out[name] = (q.astype(np.float64) * pow2(e)).astype(np.float32)  # exact
        else:
            out[name] = v.astype(np.float32)
    return out


def metadata(ck: Checkpoint) -> dict[str, str]:
    from daisychain.engine.trainer import run_id

    meta = {"format": FORMAT, "version": VERSION,
            "model": json.dumps(ck.identity["model"], sort_keys=True),
            "identity": json.dumps(ck.identity, sort_keys=True),
            "run_id": run_id(ck.identity), "step": str(ck.step),
            "params_sha256": ck.params_sha256, "task": str(ck.identity.get("task", ""))}
    vocab = ck.vocab or _vocab(ck.identity)
    if vocab is not None:
        meta["vocab"] = vocab
    return meta


def _vocab(identity: dict) -> str | None:
    """The text task's characters (class i is vocab[i]) when the checkpoint's dataset is the
    embedded default text (its fingerprint says so); None otherwise."""
    if identity.get("task") != "text":
        return None
    from daisychain.engine.data import DataError, prepare_task

    try:
        context = int(identity["model"]["input"]["dim"])
        ds = prepare_task("text", None, "text", context)
    except (DataError, KeyError, TypeError, ValueError):
        return None
    return ds.meta.get("vocab") if ds.fingerprint == identity.get("dataset") else None


# --------------------------------------------------------------------------- torch


def _module_class():
    import torch

    class DaisyChainModel(torch.nn.Module):
        """A DaisyChain model as float torch layers: ``layers`` is the registry's
        ``torch_sequential`` (one module per spec layer, named by its index, so the
        state_dict names are the checkpoint's; ``Flatten`` and an image model's input
        module hold no parameters)."""

        def __init__(self, spec: ModelSpec, meta: dict[str, str] | None = None):
            super().__init__()
            self.spec = spec
            self.meta = dict(meta or {})
            self.layers = torch_sequential(spec)

        def forward(self, x):
            """x: float (batch, features) for a dense model, int64 token ids (batch, context)
            for a text model, uint8 pixels (batch, C*H*W) or (batch, C, H, W) for an image
            model; returns the float logits (batch, classes): a transformer's at the last
            position (the token after the full window)."""
            z = self.layers(x)
            return z[:, -1] if self.spec.seq else z

        @torch.no_grad()
        def predict(self, x):
            """Class indices for a batch (or one sample) given as a numpy array, a list or a
            tensor; returns a numpy int64 array (a Python int for one sample). A regression
            model (loss "mse") returns its outputs: float (batch, outputs), (outputs,) for one."""
            kind = self.spec.input_kind
            dtype = {"dense": torch.float32, "tokens": torch.int64, "image": torch.uint8}[kind]
            x = np.asarray(x)
            if kind == "image":  # one (C, H, W) image or a (batch, C, H, W) stack: flatten
                x = x.reshape(-1) if x.ndim == 3 else x.reshape(len(x), -1) if x.ndim == 4 else x
                if x.dtype != np.uint8 and x.size and (x.min() < 0 or x.max() > 255):
                    raise ValueError("image pixels must be integers in [0, 255]")
            t = torch.as_tensor(x.astype(np.uint8) if kind == "image" else x, dtype=dtype)
            one = t.ndim == 1
            if one:
                t = t[None]
            dense = kind != "tokens"
            if t.ndim != 2 or t.shape[1] != self.spec.input_dim:
                raise ValueError(f"predict expects ({'features' if dense else 'context'},) or "
                                 f"(batch, {self.spec.input_dim}); got {tuple(t.shape)}")
            if kind == "tokens" and (int(t.min()) < 0 or int(t.max()) >= self.spec.layers[0].n_in):
                raise ValueError(f"token ids must lie in [0, {self.spec.layers[0].n_in - 1}]")
            was = self.training
            self.eval()
            z = self(t)
            out = z.double().numpy() if self.spec.loss == "mse" else z.argmax(dim=1).numpy()
            self.train(was)
            if self.spec.loss == "mse":
                return out[0] if one else out
            return int(out[0]) if one else out

    return DaisyChainModel


def torch_model(path, weights: str = "int8"):
    """The model of a checkpoint (``.pt``) or an exported ``.safetensors`` as a
    ``torch.nn.Module`` (float32, eval mode) with a ``predict(x)`` helper.

    ``weights="int8"`` (default) loads the dequantized INT8 weights the engine computes with;
    ``"master"`` (``.pt`` only) the float master weights. Raises ExportError for a file that
    is not a valid checkpoint or export."""
    import torch

    path = Path(path)
    if path.suffix == ".safetensors":
        if weights != "int8":
            raise ExportError("a .safetensors export holds the int8 weights only")
        spec, tensors, meta = _read_safetensors(path)
    else:
        ck = _read(path)
        spec = ModelSpec.from_json(ck.identity["model"])
        tensors, meta = float_tensors(spec, ck.theta, weights), metadata(ck)
    model = _module_class()(spec, meta)
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()})
    return model.eval()


def _read_safetensors(path: Path):
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ExportError(f"{path}: not a DaisyChain export (no format {FORMAT!r})")
            spec = ModelSpec.from_json(json.loads(meta["model"]))
            layout = ParamLayout(spec)
            keys = set(f.keys())
            tensors = {}
            for name, shape in zip(layout.names, layout.shapes):
                if name not in keys:
                    raise ExportError(f"{path}: missing tensor {name}")
                a = f.get_tensor(name)
                if a.dtype != np.float32 or tuple(a.shape) != tuple(shape):
                    raise ExportError(f"{path}: {name} is {a.dtype}{list(a.shape)}, the model "
                                      f"needs float32{list(shape)}")
                if not np.all(np.isfinite(a)):
                    raise ExportError(f"{path}: {name} holds non-finite values")
                tensors[name] = a
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        if isinstance(exc, ExportError):
            raise
        raise ExportError(f"{path}: not a readable DaisyChain export: {str(exc)[:300]}") from None
    return spec, tensors, meta


# --------------------------------------------------------------------------- files


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def safetensors_bytes(ck: Checkpoint) -> bytes:
    from safetensors.numpy import save

    spec = ModelSpec.from_json(ck.identity["model"])
    tensors = float_tensors(spec, ck.theta)
    for name, v in quantized(spec, ck.theta).items():
        if isinstance(v, tuple):
            q, e = v
            tensors[f"{name}.int8"] = q
            tensors[f"{name}.scale"] = np.array(pow2(e), np.float32)
    return save(tensors, metadata=metadata(ck))


def onnx_bytes(ck: Checkpoint, opset: int = 17) -> bytes:
    import io

    import torch
    try:
        import onnx
    except ImportError:
        raise ExportError("exporting .onnx needs the onnx package: pip install "
                          "'daisychain[onnx]'") from None
    spec = ModelSpec.from_json(ck.identity["model"])
    model = _module_class()(spec)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in float_tensors(spec, ck.theta).items()})
    model.eval()
    dtype = {"dense": torch.float32, "tokens": torch.int64, "image": torch.uint8}[spec.input_kind]
    example = torch.zeros(2, spec.input_dim, dtype=dtype)
    buf = io.BytesIO()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(model, (example,), buf, dynamo=False, opset_version=opset,
                          input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    proto = onnx.load_from_string(buf.getvalue())
    for k, v in metadata(ck).items():
        proto.metadata_props.add(key=k, value=v)
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def export(src, dst) -> dict:
    """Export checkpoint ``src`` to ``dst`` (.safetensors or .onnx); returns a summary."""
    dst = Path(dst)
    if dst.suffix not in SUFFIXES:
        raise ExportError(f"--to must end in {' or '.join(SUFFIXES)}, not {dst.name!r}")
    if Path(src).resolve() == dst.resolve():
        raise ExportError("--to names the checkpoint itself")
    ck = _read(src)
    data = safetensors_bytes(ck) if dst.suffix == ".safetensors" else onnx_bytes(ck)
    _atomic_write(dst, data)
    return {"path": str(dst), "bytes": len(data), "step": ck.step,
            "params_sha256": ck.params_sha256, "run_id": metadata(ck)["run_id"]}


# --------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="RUN.pt", help="a DaisyChain checkpoint")
    p.add_argument("--to", required=True, metavar="PATH",
                   help="model.safetensors (float32 + exact int8 with scales) or model.onnx")


def run(args: argparse.Namespace) -> int:
    try:
        out = export(args.checkpoint, args.to)
    except ExportError as exc:
        print(f"daisychain export: error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out['path']} ({out['bytes']} bytes): run {out['run_id']}, step {out['step']}, "
          f"params-sha256 {out['params_sha256']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="daisychain export", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
