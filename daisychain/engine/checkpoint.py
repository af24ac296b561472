"""Checkpoints: a ``.pt`` file that ``torch.load`` reads, and a checked, code-free loader.

Layout (a plain dict, so ``torch.load(path, weights_only=True)`` loads it)::

    {"format": "daisychain-checkpoint", "version": 1,
     "identity": {...run identity...}, "run_id": str, "step": int,
     "params_sha256": str,                       # over the canonical float64 bytes
     "state_dict": {name: float64 tensor},       # torch nn.Linear / nn.Embedding names
     "adam": {"m": {name: tensor}, "v": {name: tensor}, "step": int,
              "b1t": float, "b2t": float},
     "vocab": str,                               # text task only: class i is vocab[i]
     "local": {"outer": {name: tensor},          # local-steps run only (engine/local.py):
               "m": [{name: tensor}, ...],       # the outer buffer, and replicas 1..R-1's
               "v": [{name: tensor}, ...],       # moments (replica 0's are "adam"'s) at
               "hist": [{name: tensor}, ...]}}   # the anchor; theta_g of the rounds since

In a local-steps run, "state_dict" is the global parameters theta_g, "step" the round and
"adam"'s step the inner steps (round * sync_every), b1t/b2t their bias products.

``load_checkpoint`` parses with torch's weights-only unpickler (it refuses any object that
is not a tensor or a plain container, so nothing in the file executes), then checks the
format, every name, shape and dtype against the run's model, finiteness, and the parameter
hash, and the identity against the run. A bad file raises :class:`CheckpointError` with the
reason and changes nothing.

Nothing a file declares is allocated before it is checked against the file's own size: the
zip must store its entries uncompressed (as ``torch.save`` does; a deflated entry could
expand far past the file, a "zip bomb") with sizes inside the file; the model the identity
declares must fit the file (3 float64 tensors per parameter); every tensor must be dense and
contiguous over bytes it really has (a stride-0 tensor of a few bytes could stand for
gigabytes); the identity must be plain JSON at most :data:`MAX_JSON_DEPTH` deep.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np

from daisychain.engine.adam import AdamState
from daisychain.engine.model import ParamLayout
from daisychain.engine.spec import Hyper, ModelSpec, SpecError, layers_text
from daisychain.engine.trainer import identity_differences, params_sha256, run_id

FORMAT = "daisychain-checkpoint"
VERSION = 1
MAX_BYTES = 512 * 2**20
#: Deepest nesting of the identity (and any JSON header) that is read; deeper is refused.
MAX_JSON_DEPTH = 32
#: Most values in the identity (and any JSON header).
MAX_JSON_NODES = 100_000
#: Most entries in a checkpoint's zip (torch.save writes a handful plus one per tensor).
MAX_ZIP_ENTRIES = 4096


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, with a message saying why."""


@dataclass
class Checkpoint:
    identity: dict
    step: int
    theta: np.ndarray
    adam: AdamState
    params_sha256: str
    vocab: str | None = None  #: text task: the character of each class (not in the run id)
    local: object | None = None  #: a local-steps run's whole state (engine/local.py LocalState)


def check_json_tree(value, what: str = "identity", max_depth: int = MAX_JSON_DEPTH,
                    max_nodes: int = MAX_JSON_NODES) -> None:
    """Refuse (CheckpointError) anything but plain JSON values (str keys, finite numbers)
    nested at most ``max_depth`` deep with at most ``max_nodes`` values; iterative, so a
    hostile depth cannot exhaust the stack."""
    stack, seen = [(value, 0)], 0
    while stack:
        v, depth = stack.pop()
        seen += 1
        if seen > max_nodes:
            raise CheckpointError(f"{what} holds more than {max_nodes} values")
        if isinstance(v, (dict, list, tuple)):
            if depth >= max_depth:
                raise CheckpointError(f"{what} is nested deeper than {max_depth} levels")
            if isinstance(v, dict):
                if not all(isinstance(k, str) for k in v):
                    raise CheckpointError(f"{what} has an object key that is not a string")
                stack.extend((x, depth + 1) for x in v.values())
            else:
                stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise CheckpointError(f"{what} holds a non-finite number")
        elif not (v is None or isinstance(v, (str, int, bool))):
            raise CheckpointError(f"{what} holds a {type(v).__name__}, which is not JSON")


def _check_zip(data: bytes) -> None:
    """The zip's entries must be stored (not compressed) and fit inside the file."""
    import zipfile

    if data[:4] != b"PK\x03\x04":
        raise CheckpointError("not a loadable checkpoint (refused before torch's weights-only "
                              "loader): not a zip-format .pt file, which is what torch.save "
                              "writes")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise CheckpointError(f"not a loadable checkpoint (refused before torch's weights-only "
                              f"loader): a broken zip ({str(exc)[:200]})") from None
    if len(infos) > MAX_ZIP_ENTRIES:
        raise CheckpointError(f"the checkpoint's zip has {len(infos)} entries, more than "
                              f"{MAX_ZIP_ENTRIES}")
    total = 0
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(f"the checkpoint's zip entry {info.filename[:80]!r} is "
                                  f"compressed (method {info.compress_type}); torch.save stores "
                                  f"entries uncompressed, and a compressed one could expand far "
                                  f"past the file's {len(data)} bytes")
        total += info.file_size
        if info.file_size > len(data) or total > len(data):
            raise CheckpointError(f"the checkpoint's zip declares {total} bytes of entries, more "
                                  f"than the file's {len(data)} bytes")


def normalize_identity(identity: dict) -> dict:
    """The identity with its hyperparameters as Python's ``Hyper`` writes them (a JSON ``0``
    from a page is the float ``0.0``), so that its run id is the run's. Raises CheckpointError."""
    try:
        return {**identity, "hyper": Hyper(**identity["hyper"]).to_json()}
    except (KeyError, TypeError, SpecError) as exc:
        raise CheckpointError(f"the run identity's hyperparameters are invalid: {exc}") from None


def _differences(expected: dict, identity: dict) -> list[str]:
    return [d.replace(" in the run", " in the checkpoint")
            for d in identity_differences(expected, identity)]


def save_checkpoint(identity: dict, step: int, theta: np.ndarray, adam: AdamState,
                    vocab: str | None = None, local=None) -> bytes:
    """The .pt bytes; ``vocab`` (the text task's characters, ``Dataset.meta["vocab"]``) rides
    along so that a model that leaves keeps the meaning of its classes. ``local``: a
    local-steps run's LocalState (then ``adam`` is ignored: it is made from ``local``)."""
    import torch

    identity = normalize_identity(identity)

    spec = ModelSpec.from_json(identity["model"])
    layout = ParamLayout(spec)

    def tensors(flat):
        return {n: torch.from_numpy(np.ascontiguousarray(v).copy())
                for n, v in zip(layout.names, layout.views(flat))}

    if local is not None:
        theta, step = local.theta, local.step
        adam = AdamState(local.m[0], local.v[0], local.inner, local.b1t, local.b2t)
    obj = {"format": FORMAT, "version": VERSION, "identity": identity, "run_id": run_id(identity),
           "step": int(step), "params_sha256": params_sha256(theta),
           "state_dict": tensors(theta),
           "adam": {"m": tensors(adam.m), "v": tensors(adam.v), "step": int(adam.step),
                    "b1t": float(adam.b1t), "b2t": float(adam.b2t)}}
    if vocab is not None:
        obj["vocab"] = _checked_vocab(vocab, spec)
    if local is not None:
        obj["local"] = {"outer": tensors(local.outer), "m": [tensors(a) for a in local.m[1:]],
                        "v": [tensors(a) for a in local.v[1:]]}
        if local.hist.size:  # theta_g of the rounds since the anchor (engine/local.py)
            obj["local"]["hist"] = [tensors(a) for a in local.hist]
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _tensor_dict(obj, what: str, layout: ParamLayout) -> np.ndarray:
    import torch

    if not isinstance(obj, dict):
        raise CheckpointError(f"{what} must be a dict of tensors")
    names = set(obj)
    want = set(layout.names)
    if names != want:
        missing, extra = sorted(want - names), sorted(names - want)
        raise CheckpointError(f"{what} does not match the run's model: "
                              f"missing {missing or 'nothing'}, unexpected {extra or 'nothing'}")
    flat = np.empty(layout.size, np.float64)
    for name, shape, off in zip(layout.names, layout.shapes, layout.offsets):
        t = obj[name]
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{what}[{name!r}] is not a tensor")
        if tuple(t.shape) != tuple(shape):
            raise CheckpointError(f"{what}[{name!r}] has shape {tuple(t.shape)}, the run's model "
                                  f"needs {tuple(shape)}")
        if t.dtype != torch.float64:
            raise CheckpointError(f"{what}[{name!r}] is {t.dtype}, must be torch.float64")
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            raise CheckpointError(f"{what}[{name!r}] is not a dense tensor ({t.layout})")
        if not t.is_contiguous():
            raise CheckpointError(f"{what}[{name!r}] has strides {tuple(t.stride())}, not the "
                                  f"contiguous layout torch.save writes (a stride of 0 would "
                                  f"repeat a few stored bytes as a whole tensor)")
        have = t.untyped_storage().nbytes()
        if (t.storage_offset() + t.numel()) * 8 > have:
            raise CheckpointError(f"{what}[{name!r}] needs {t.numel() * 8} bytes, its storage "
                                  f"holds {have}")
        a = t.detach().cpu().contiguous().numpy().ravel()
        if not np.all(np.isfinite(a)):
            raise CheckpointError(f"{what}[{name!r}] holds non-finite values")
        flat[off:off + a.size] = a
    return flat


def _loader_reason(exc: BaseException) -> str:
    """torch's refusal in a few words, without its advice to retry with weights_only=False
    (which would execute whatever the file holds)."""
    import re

    text = str(exc).strip()
    if "Weights only load failed" in text:
        m = re.search(r"(Unsupported global: [^\n.]*|Unsupported operand [^\n.]*|"
                      r"Trying to [^\n.]*)", text)
        return ("the file holds objects other than tensors and plain containers"
                + (f" ({m.group(1).strip()})" if m else "") + "; it is not a checkpoint")
    return text.splitlines()[0] if text else type(exc).__name__


def load_checkpoint(data: bytes, expected_identity: dict | None = None) -> Checkpoint:
    """Parse and check a checkpoint; raises CheckpointError on anything wrong."""
    import pickle
    import zipfile

    import torch

    if len(data) > MAX_BYTES:
        raise CheckpointError(f"checkpoint is {len(data)} bytes, more than {MAX_BYTES}")
    _check_zip(data)
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError,
            TypeError, AttributeError, KeyError, IndexError, OSError, RecursionError,
            OverflowError, MemoryError) as exc:
        first = _loader_reason(exc)
        raise CheckpointError(f"not a loadable checkpoint (refused by torch's weights-only "
                              f"loader): {first[:300]}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CheckpointError(f"not a DaisyChain checkpoint (no format {FORMAT!r})")
    if obj.get("version") != VERSION:
        raise CheckpointError(f"checkpoint version {obj.get('version')!r}, this build reads {VERSION}")
    identity = obj.get("identity")
    if not isinstance(identity, dict) or "model" not in identity:
        raise CheckpointError("checkpoint has no run identity")
    check_json_tree(identity, "the checkpoint's identity")
    if expected_identity is not None:
        check_json_tree(expected_identity, "the expected identity")
    spec = _spec(identity, "checkpoint's")
    identity = normalize_identity(identity)
    if expected_identity is not None:
        diffs = _differences(expected_identity, identity)
        if diffs:
            raise CheckpointError("checkpoint belongs to another run: " + "; ".join(diffs))
    layout = _layout(spec, len(data), "checkpoint file")
    theta = _tensor_dict(obj.get("state_dict"), "state_dict", layout)
    got = params_sha256(theta)
    if obj.get("params_sha256") != got:
        raise CheckpointError(f"parameter hash mismatch: file says {obj.get('params_sha256')!r}, "
                              f"its tensors hash to {got}")
    adam = obj.get("adam")
    if not isinstance(adam, dict):
        raise CheckpointError("checkpoint has no Adam state")
    m = _tensor_dict(adam.get("m"), "adam.m", layout)
    v = _tensor_dict(adam.get("v"), "adam.v", layout)
    if np.any(v < 0):
        raise CheckpointError("adam.v holds negative values")
    step, astep = obj.get("step"), adam.get("step")
    b1t, b2t = adam.get("b1t"), adam.get("b2t")
    try:
        hp = Hyper(**identity["hyper"])
        hp.validate()
    except SpecError as exc:
        raise CheckpointError(f"the run identity's hyperparameters are invalid: {exc}") from None
    if not (isinstance(step, int) and isinstance(astep, int) and 0 <= step < 2**40
            and astep == step * hp.sync_every):
        raise CheckpointError("checkpoint step counters are missing or inconsistent")
    if not all(isinstance(b, float) and math.isfinite(b) and 0 <= b <= 1 for b in (b1t, b2t)):
        raise CheckpointError("checkpoint bias-correction products are invalid")
    vocab = obj.get("vocab")
    if vocab is not None:
        vocab = _checked_vocab(vocab, spec)
    local = _local_state(obj.get("local"), hp, layout, len(data), theta, m, v, step, b1t, b2t)
    return Checkpoint(identity, step, theta, AdamState(m, v, astep, b1t, b2t), got, vocab, local)


def _local_state(obj, hp: Hyper, layout: ParamLayout, size: int, theta, m, v, step, b1t, b2t):
    """A local-steps run's LocalState from the checkpoint's "local" entry (None for a
    synchronous run, which must not have one)."""
    from daisychain.engine.local import LocalState

    if not hp.local:
        if obj is not None:
            raise CheckpointError("a synchronous run's checkpoint with a local-steps state")
        return None
    r = hp.replicas
    if not isinstance(obj, dict) or not all(isinstance(obj.get(k), list) and len(obj[k]) == r - 1
                                            for k in ("m", "v")):
        raise CheckpointError(f"a local-steps run's checkpoint needs its outer buffer and the "
                              f"moments of replicas 1..{r - 1}")
    n = step % hp.moments_every  # rounds since the anchor, whose theta_g the checkpoint holds
    hist = obj.get("hist", [])
    if not isinstance(hist, list) or len(hist) != n:
        raise CheckpointError(f"a local-steps run's checkpoint at round {step} needs theta_g of "
                              f"the {n} round(s) since its anchor (local.hist)")
    need = (2 + 2 * r + n) * 8 * layout.size
    if need > size:
        raise CheckpointError(f"{r} replicas of {layout.size} parameters need {need} bytes, more "
                              f"than the checkpoint file's {size}")
    outer = _tensor_dict(obj.get("outer"), "local.outer", layout)
    ms = np.stack([m] + [_tensor_dict(t, f"local.m[{i}]", layout) for i, t in enumerate(obj["m"])])
    vs = np.stack([v] + [_tensor_dict(t, f"local.v[{i}]", layout) for i, t in enumerate(obj["v"])])
    if np.any(vs < 0):
        raise CheckpointError("local.v holds negative values")
    rows = [_tensor_dict(t, f"local.hist[{i}]", layout) for i, t in enumerate(hist)]
    hist = np.stack(rows) if rows else np.zeros((0, layout.size))
    return LocalState(theta.copy(), outer, ms, vs, step, step * hp.sync_every, b1t, b2t, hist)


def _checked_vocab(vocab, spec: ModelSpec) -> str:
    """A text model's vocabulary: one distinct character per class of the model."""
    if (not isinstance(vocab, str) or spec.input_kind != "tokens" or len(vocab) != spec.classes
            or len(set(vocab)) != len(vocab)):
        raise CheckpointError(f"the checkpoint's vocab must be {spec.classes} distinct "
                              f"characters of a text model")
    return vocab


# --------------------------------------------------------------------------- state blob
# The replica state as raw bytes, for pages that cannot write a .pt themselves:
# b"DCSV", u32 LE header length, header JSON {"identity", "step", "b1t", "b2t",
# "params_sha256"}, then theta, Adam m, Adam v: float64 little-endian, canonical order.

STATE_MAGIC = b"DCSV"


def _spec(identity: dict, whose: str) -> ModelSpec:
    try:
        return ModelSpec.from_json(identity["model"])
    except (SpecError, KeyError, TypeError, ValueError, AttributeError, IndexError,
            OverflowError, RecursionError) as exc:
        raise CheckpointError(f"{whose} model spec is invalid: {str(exc)[:300]}") from None


def _layout(spec: ModelSpec, size: int, what: str) -> ParamLayout:
    """The model's layout, if its three float64 tensors (theta, Adam m and v) can be in
    ``size`` bytes: a small file cannot make the reader allocate a large model."""
    try:
        layout = ParamLayout(spec)
    except (ValueError, TypeError, OverflowError, MemoryError) as exc:
        raise CheckpointError(f"the model spec is invalid: {str(exc)[:300]}") from None
    need = 3 * 8 * layout.size
    if need > size:
        raise CheckpointError(f"the model declares {layout.size} parameters ({need} bytes of "
                              f"tensors), more than the {what}'s {size} bytes could hold")
    return layout


def encode_state(identity: dict, step: int, theta: np.ndarray, adam: AdamState) -> bytes:
    import json
    import struct

    head = json.dumps({"identity": identity, "step": int(step), "b1t": float(adam.b1t),
                       "b2t": float(adam.b2t), "params_sha256": params_sha256(theta)},
                      sort_keys=True).encode()
    arrays = [np.ascontiguousarray(a, "<f8").tobytes() for a in (theta, adam.m, adam.v)]
    return b"".join([STATE_MAGIC, struct.pack("<I", len(head)), head, *arrays])


def decode_state(data: bytes, expected_identity: dict | None = None) -> Checkpoint:
    """Parse a state blob and check it like a checkpoint (model, finiteness, hash)."""
    import json
    import struct

    if len(data) < 8 or data[:4] != STATE_MAGIC:
        raise CheckpointError("not a DaisyChain state (bad magic)")
    (n,) = struct.unpack_from("<I", data, 4)
    if n > len(data) - 8:
        raise CheckpointError(f"state header declares {n} bytes, the state has {len(data) - 8}")
    try:
        head = json.loads(data[8:8 + n], parse_constant=_no_constant)
    except RecursionError:
        raise CheckpointError(f"state header is nested deeper than {MAX_JSON_DEPTH} levels") \
            from None
    except ValueError as exc:
        raise CheckpointError(f"state header is invalid: {str(exc)[:300]}") from None
    check_json_tree(head, "the state header")
    if not isinstance(head, dict) or not isinstance(head.get("identity"), dict):
        raise CheckpointError("state header is invalid: no identity object")
    identity = head["identity"]
    spec = _spec(identity, "the state's")
    identity = normalize_identity(identity)
    if expected_identity is not None:
        check_json_tree(expected_identity, "the expected identity")
        diffs = _differences(expected_identity, identity)
        if diffs:
            raise CheckpointError("state belongs to another run: " + "; ".join(diffs))
    size = _layout(spec, len(data), "state").size
    body = data[8 + n:]
    if len(body) != 3 * 8 * size:
        raise CheckpointError(f"state holds {len(body)} bytes of tensors, the model needs {24 * size}")
    theta, m, v = (np.frombuffer(body, "<f8", size, k * 8 * size).astype(np.float64) for k in range(3))
    if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(m)) and np.all(np.isfinite(v))):
        raise CheckpointError("state holds non-finite values")
    got = params_sha256(theta)
    if head.get("params_sha256") != got:
        raise CheckpointError(f"parameter hash mismatch: header says {head.get('params_sha256')!r}, "
                              f"tensors hash to {got}")
    step, b1t, b2t = head.get("step"), head.get("b1t"), head.get("b2t")
    if not (isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2**40):
        raise CheckpointError("state step is invalid")
    # JSON from a page writes 1.0 as 1: any number, as a float
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)
               and 0 <= b <= 1 for b in (b1t, b2t)):
        raise CheckpointError("state bias-correction products are invalid")
    b1t, b2t = float(b1t), float(b2t)
    return Checkpoint(identity, step, theta, AdamState(m, v, step, b1t, b2t), got)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


# --------------------------------------------------------------------------- files
# What daisy-peer and ``daisychain demo`` do with --save-checkpoint and --resume.


def write_checkpoint_file(path, identity: dict, step: int, theta: np.ndarray,
                          adam: AdamState, vocab: str | None = None, local=None) -> None:
    """Write the .pt atomically (a temporary file next to it, then a rename): a crash while
    saving never leaves half a checkpoint where the last good one was."""
    import os
    from pathlib import Path

    path = Path(path)
    data = save_checkpoint(identity, step, theta, adam, vocab, local)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_checkpoint_file(path, expected_identity: dict | None = None) -> Checkpoint:
    """Read and check a .pt file; CheckpointError names the file and what is wrong, and for
    a file of another run also the settings that would match it."""
    from pathlib import Path

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return load_checkpoint(data, expected_identity)
    except CheckpointError as exc:
        hint = ""
        if "another run" in str(exc):
            try:
                import torch
                obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
                hint = f" (its run was made with: {run_flags(obj['identity'])})"
            except Exception:  # noqa: BLE001 - the hint is a courtesy only
                hint = ""
        raise CheckpointError(f"{path}: {exc}{hint}") from None


def run_flags(identity: dict) -> str:
    """The run-settings flags (``daisychain train`` / ``daisy-peer``) of an identity."""
    hp = identity.get("hyper", {})
    spec = ModelSpec.from_json(identity["model"])
    flags = [f"--task {identity.get('task')}"]
    if spec.input_kind == "tokens":
        flags += [f"--context {spec.input_dim}", f"--embed-dim {spec.layers[0].n_out}"]
    text = layers_text(spec)
    if text.isdigit():
        flags.append(f"--hidden {text}")
    elif text:
        flags.append(f"--layers {text}")
    flags += [f"--seed {hp.get('seed')}", f"--batch {hp.get('batch')}",
              f"--micro-batch {hp.get('micro_batch')}", f"--lr {hp.get('lr')}"]
    if hp.get("weight_decay"):
        flags.append(f"--weight-decay {hp.get('weight_decay')}")
    for name in ("augment_shift", "lr_warmup", "lr_decay_steps"):  # the image task's defaults are not 0
        if hp.get(name) or identity.get("task") == "image":
            flags.append(f"--{name.replace('_', '-')} {hp.get(name, 0)}")
    for name in ("replicas", "sync_every", "outer_lr", "outer_momentum", "moments_every"):  # local steps
        if name in hp:
            flags.append(f"--{name.replace('_', '-')} {hp[name]}")
    return " ".join(flags)
