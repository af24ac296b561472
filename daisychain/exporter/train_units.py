"""Train the units as small torch networks ("emulated GPU logic") and verify them.

Each unit is learned from the bit encoding of its inputs, snapped to a fixed-point grid,
turned into an *integer* network evaluated in int64, and checked against the exact
definition (:mod:`daisychain.units.reference`) on every input of its domain. A unit that
is wrong on a single input is refused with its first counter-example; the exporter then
tries the next seed. Only verified integer networks produce tables.

Recipes (from the prototype in ENGINE_NOTES.md):

* ``mul``: 64 hidden units, one per operand bit pair, ``relu(w1*a_i + w2*b_j + c)``, plus a
  linear skip from the 16 bits; live AND-gate initialisation; full-domain MSE in float64
  with L-BFGS (strong Wolfe). Hidden weights snap to multiples of 2**-4, the output layer
  is re-solved by least squares and snapped to 2**-10.
* ``relu``: dense 8-4-1 on the 8 bits, same snapping.
* ``requantize`` (the 16-bit table: rounding shift by 7, saturate to ±127): two stages, a
  ``Linear(16, 1)`` for the rounded shift (linear in the bits) and a 1-D saturation net
  (4 ReLUs + skip) on its integer output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from daisychain.units import reference as ref

HIDDEN_FRAC = 4  #: mul's hidden weights are multiples of 2**-HIDDEN_FRAC
FINE_FRAC = 8  #: the small nets (relu, saturation) snap their hidden layer to 2**-FINE_FRAC
OUT_FRAC = 10  #: output weights are multiples of 2**-OUT_FRAC
MAX_SEEDS = 16


class UnitVerificationError(Exception):
    """A trained unit disagrees with its definition on at least one input."""


@dataclass
class UnitResult:
    name: str
    table: np.ndarray  #: int32, the verified table
    seed: int
    seeds_tried: int
    max_residual: float  #: max |network output - exact| before the final rounding
    info: dict = field(default_factory=dict)


def bits(x: np.ndarray, n: int) -> np.ndarray:
    """Two's-complement bits of integers, least significant first: (len(x), n) int64."""
    u = np.asarray(x, np.int64) & ((1 << n) - 1)
    return (u[:, None] >> np.arange(n)) & 1


def verify(name: str, got: np.ndarray, want: np.ndarray, describe) -> None:
    """Raise :class:`UnitVerificationError` with the first input where ``got != want``."""
    got = np.asarray(got, np.int64)
    want = np.asarray(want, np.int64)
    if got.shape != want.shape:
        raise UnitVerificationError(f"{name}: table has shape {got.shape}, expected {want.shape}")
    wrong = np.flatnonzero(got != want)
    if wrong.size:
        i = int(wrong[0])
        raise UnitVerificationError(
            f"{name}: wrong on {wrong.size} of {want.size} inputs; first counter-example: "
            f"{describe(i)} gave {int(got[i])}, expected {int(want[i])}")


def _snap(x: np.ndarray, frac: int) -> np.ndarray:
    """Nearest multiple of 2**-frac, as an integer count of 2**-frac (round half up)."""
    return np.floor(np.asarray(x, np.float64) * (1 << frac) + 0.5).astype(np.int64)


def _round_shift(y: np.ndarray, s: int) -> np.ndarray:
    """floor(y / 2**s + 1/2) for int64 y."""
    return (y + (1 << (s - 1))) >> s


def _lbfgs(params, loss_fn, max_iter: int, bar: tqdm) -> float:
    opt = torch.optim.LBFGS(params, lr=1, max_iter=max_iter, history_size=50,
                            tolerance_grad=1e-14, tolerance_change=1e-18,
                            line_search_fn="strong_wolfe")
    evals = [0]

    def closure():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        evals[0] += 1
        if evals[0] % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.2e}", refresh=False)
            bar.update(10)
        return loss

    loss = opt.step(closure)
    return float(loss.detach())


def _lstsq_out(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    sol, *_ = np.linalg.lstsq(features.astype(np.float64), target.astype(np.float64), rcond=None)
    return sol


# --------------------------------------------------------------------------- mul


def _mul_try(seed: int, bar: tqdm, max_iter: int) -> tuple[np.ndarray, float]:
    g = torch.Generator().manual_seed(seed)
    a, b = np.meshgrid(np.arange(-128, 128), np.arange(-128, 128), indexing="ij")
    a, b = a.ravel(), b.ravel()
    abits, bbits = bits(a, 8), bits(b, 8)
    A = torch.tensor(abits, dtype=torch.float64)
    B = torch.tensor(bbits, dtype=torch.float64)
    X = torch.cat([A, B], 1)
    target = torch.tensor(a * b / 2.0**14, dtype=torch.float64)

    w1 = torch.rand(8, 8, generator=g, dtype=torch.float64) + 0.5
    w2 = torch.rand(8, 8, generator=g, dtype=torch.float64) + 0.5
    c = -(torch.rand(8, 8, generator=g, dtype=torch.float64) + 0.5) * torch.minimum(w1, w2)
    w1, w2, c = (p.requires_grad_() for p in (w1, w2, c))

    def hidden(w1, w2, c):
        return torch.relu(w1 * A[:, :, None] + w2 * B[:, None, :] + c).reshape(-1, 64)

    with torch.no_grad():
        feats = torch.cat([hidden(w1, w2, c), X, torch.ones(len(X), 1, dtype=torch.float64)], 1)
        out0 = torch.linalg.lstsq(feats, target[:, None]).solution[:, 0]
    v = out0.clone().requires_grad_()

    def loss_fn():
        feats = torch.cat([hidden(w1, w2, c), X, torch.ones(len(X), 1, dtype=torch.float64)], 1)
        return torch.mean((feats @ v - target) ** 2)

    _lbfgs([w1, w2, c, v], loss_fn, max_iter, bar)

    # integer network: hidden in units of 2**-4, output in units of 2**-10
    W1, W2, C = (_snap(p.detach().numpy(), HIDDEN_FRAC) for p in (w1, w2, c))
    H = np.maximum(W1[None] * abits[:, :, None] + W2[None] * bbits[:, None, :] + C[None], 0)
    H = H.reshape(-1, 64)  # int64, value * 2**4
    feats = np.concatenate([H / 16.0, abits, bbits, np.ones((len(a), 1))], 1)
    sol = _lstsq_out(feats, a * b)
    V = _snap(sol, OUT_FRAC)
    # y * 2**(OUT_FRAC + HIDDEN_FRAC) as an exact int64
    Y = H @ V[:64] + (np.concatenate([abits, bbits], 1) @ V[64:80] + V[80]) * (1 << HIDDEN_FRAC)
    s = OUT_FRAC + HIDDEN_FRAC
    residual = float(np.max(np.abs(Y / 2.0**s - a * b)))
    return _round_shift(Y, s), residual


def train_mul(base_seed: int = 0, max_iter: int = 400) -> UnitResult:
    a, b = np.meshgrid(np.arange(-128, 128), np.arange(-128, 128), indexing="ij")
    want = ref.mul_exact(a.ravel(), b.ravel())
    return _seed_loop("mul", base_seed, max_iter, _mul_try, want,
                      lambda i: f"mul(a={i // 256 - 128}, b={i % 256 - 128})")


# --------------------------------------------------------------------------- relu


def _relu_try(seed: int, bar: tqdm, max_iter: int) -> tuple[np.ndarray, float]:
    g = torch.Generator().manual_seed(seed)
    x = np.arange(-128, 128)
    xb = bits(x, 8)
    X = torch.tensor(xb, dtype=torch.float64)
    target = torch.tensor(ref.relu_exact(x) / 128.0, dtype=torch.float64)
    W = (torch.randn(8, 4, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    bvec = (torch.randn(4, generator=g, dtype=torch.float64) * 0.1).requires_grad_()
    v = (torch.randn(4, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    d = torch.zeros(1, dtype=torch.float64, requires_grad=True)

    def loss_fn():
        return torch.mean((torch.relu(X @ W + bvec) @ v + d - target) ** 2)

    _lbfgs([W, bvec, v, d], loss_fn, max_iter, bar)
    # Move each output weight's magnitude (and the 1/128 target scale) into its hidden
    # unit, so the hidden weights are in raw units: v*relu(z) == sign(v)*relu(|v|*z).
    scale = 128.0 * np.abs(v.detach().numpy())
    Wn = _snap(W.detach().numpy() * scale, FINE_FRAC)
    bn = _snap(bvec.detach().numpy() * scale, FINE_FRAC)
    H = np.maximum(xb @ Wn + bn, 0)  # value * 2**FINE_FRAC
    feats = np.concatenate([H / 2.0**FINE_FRAC, np.ones((len(x), 1))], 1)
    sol = _lstsq_out(feats, ref.relu_exact(x))
    V = _snap(sol, OUT_FRAC)
    Y = H @ V[:4] + V[4] * (1 << FINE_FRAC)
    s = OUT_FRAC + FINE_FRAC
    residual = float(np.max(np.abs(Y / 2.0**s - ref.relu_exact(x))))
    return _round_shift(Y, s), residual


def train_relu(base_seed: int = 0, max_iter: int = 300) -> UnitResult:
    want = ref.relu_exact(np.arange(-128, 128))
    return _seed_loop("relu", base_seed, max_iter, _relu_try, want,
                      lambda i: f"relu(x={i - 128})")


# --------------------------------------------------------------------------- requantize


def _rq_try(seed: int, bar: tqdm, max_iter: int) -> tuple[np.ndarray, float]:
    g = torch.Generator().manual_seed(seed)
    x = np.arange(-32768, 32768)
    xb = bits(x, 16)
    # stage 1: the rounded shift floor((x + 64) / 128) is linear in the bits
    shifted = (x + 64) >> ref.RQ_TABLE_SHIFT
    X = torch.tensor(xb, dtype=torch.float64)
    t1 = torch.tensor(shifted / 256.0, dtype=torch.float64)
    w = (torch.randn(16, generator=g, dtype=torch.float64) * 0.1).requires_grad_()
    b0 = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    _lbfgs([w, b0], lambda: torch.mean((X @ w + b0 - t1) ** 2), max_iter // 2, bar)
    W1 = _snap(w.detach().numpy() * 256.0, HIDDEN_FRAC)
    B1 = _snap(b0.detach().numpy() * 256.0, HIDDEN_FRAC)
    y1 = _round_shift(xb @ W1 + B1[0], HIDDEN_FRAC)  # integer stage-1 output
    verify("requantize stage 1", y1, shifted, lambda i: f"shift7(x={x[i]})")

    # stage 2: saturation clamp(y, -127, 127) on the 1-D domain of stage-1 outputs
    y = np.arange(int(y1.min()), int(y1.max()) + 1)
    Y = torch.tensor(y / 256.0, dtype=torch.float64)[:, None]
    t2 = torch.tensor(np.clip(y, -ref.SAT, ref.SAT) / 256.0, dtype=torch.float64)
    wh = (torch.randn(1, 4, generator=g, dtype=torch.float64)).requires_grad_()
    bh = (torch.randn(4, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    v = (torch.randn(4, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    skip = torch.zeros(2, dtype=torch.float64, requires_grad=True)

    def loss2():
        return torch.mean((torch.relu(Y @ wh + bh) @ v + Y[:, 0] * skip[0] + skip[1] - t2) ** 2)

    _lbfgs([wh, bh, v, skip], loss2, max_iter, bar)
    # in raw units: 256*v*relu(wh*y/256 + bh) == sign(v)*relu(|v|*wh*y + 256*|v|*bh)
    vv = np.abs(v.detach().numpy())
    Wh = _snap(wh.detach().numpy()[0] * vv, FINE_FRAC)
    Bh = _snap(bh.detach().numpy() * vv * 256.0, FINE_FRAC)
    Hy = np.maximum(y[:, None] * Wh[None] + Bh[None], 0)  # value * 2**FINE_FRAC
    feats = np.concatenate([Hy / 2.0**FINE_FRAC, y[:, None], np.ones((len(y), 1))], 1)
    sol = _lstsq_out(feats, np.clip(y, -ref.SAT, ref.SAT))
    V = _snap(sol, OUT_FRAC)
    s = OUT_FRAC + FINE_FRAC
    Y2 = Hy @ V[:4] + (y * V[4] + V[5]) * (1 << FINE_FRAC)
    out_y = _round_shift(Y2, s)
    residual = float(np.max(np.abs(Y2 / 2.0**s - np.clip(y, -ref.SAT, ref.SAT))))
    return out_y[y1 - y[0]], residual


def train_requantize(base_seed: int = 0, max_iter: int = 300) -> UnitResult:
    want = ref.rq_table_exact(np.arange(-32768, 32768))
    return _seed_loop("requantize", base_seed, max_iter, _rq_try, want,
                      lambda i: f"requantize-table(x={i - 32768})")


# --------------------------------------------------------------------------- driver


def _seed_loop(name, base_seed, max_iter, try_fn, want, describe) -> UnitResult:
    torch.set_num_threads(1)  # one thread: the same seed gives the same float weights
    last = None
    for k in range(MAX_SEEDS):
        seed = base_seed + k
        with tqdm(total=max_iter, desc=f"{name} seed {seed}", unit="eval", leave=False) as bar:
            try:
                table, residual = try_fn(seed, bar, max_iter)
                verify(name, table, want, describe)
            except UnitVerificationError as exc:
                last = exc
                # the normal search (a seed's network is not always exact): not an error
                tqdm.write(f"  {name} seed {seed}: not exact ({_reason(name, exc)})"
                           + ("; trying the next seed" if k + 1 < MAX_SEEDS else ""))
                continue
        return UnitResult(name, table.astype(np.int32), seed, k + 1, residual)
    raise UnitVerificationError(f"{name}: no seed in {base_seed}..{base_seed + MAX_SEEDS - 1} "
                                f"gave an exact unit; last: {last}")


def _reason(name: str, exc: BaseException) -> str:
    text = str(exc).removeprefix(f"{name}: ")
    return text.splitlines()[0] if text else type(exc).__name__
