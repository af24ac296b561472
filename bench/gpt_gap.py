"""Why the INT8 transformer lags its ``--float`` twin (issue 37): ``daisychain train --float``
with one of the engine's approximations added to the torch float32 twin, so that a variant
whose loss rises by the gap names the approximation that costs it.

    python bench/gpt_gap.py VARIANT train --task text --data TEXT --float --context 32 \\
        --layers block64h4,block64h4 --steps 400 --seed 0 --threads 1 --json

VARIANT (each straight-through: the forward value is the approximation, the gradient
passes as if it were not there):

* ``none``: the plain twin;
* ``softmax7``: attention probabilities rounded to 1/128, as the integer softmax's;
* ``int8fwd``: every linear's input and weight quantized to int8 with the power-of-two scale
  of the engine (e = frexp exponent of max|v| - 7), per call;
* ``outerr``: the logits' gradient quantized as the engine's output error: int8 per
  micro-batch of 16 windows (a quarter of the batch), power-of-two scale, then zero-sum per
  row (the target entry takes minus the others' sum, at least -127);
* ``outerr-sr``: ``outerr`` with stochastic rounding (floor(v + u), u uniform in [0, 1),
  torch's generator): whether an unbiased rounding of the output error closes the gap;
* ``linq``: the backward's errors as the engine's requantize makes them: the gradient of
  every linear's output and of its input rounded to int8 per micro-batch (one power-of-two
  scale, round half up), as the block's G3, Gh, Go, Gq/Gk/Gv and the errors through the
  weights;
* ``softq``: the gradient of the attention scores (the softmax's backward, the engine's GS)
  rounded the same way, one scale per micro-batch over every head and row;
* ``normq``: the gradient of every norm's output rounded the same way (the int8 error the
  engine's norm backward reads);
* ``-sr`` after ``linq``, ``softq`` or ``normq``: the same with stochastic rounding.

Variants combine with ``+``: ``outerr-sr+linq+softq`` is the float twin with all three.

Not a test and not the engine: torch float32 with monkeypatched functions; the number to
read is ``test_loss`` against ``none``'s (docs/BENCHMARKS.md, "The transformer").
"""

from __future__ import annotations

import sys

import torch


def _pow2_scale(m: torch.Tensor) -> float:
    return 2.0 ** float(torch.frexp(m)[1] - 7) if m > 0 else 1.0


def _fq(t: torch.Tensor) -> torch.Tensor:
    s = _pow2_scale(t.detach().abs().max())
    q = torch.clamp(torch.floor(t / s + 0.5), -127, 127) * s
    return t + (q - t).detach()


def _gq(stochastic: bool):
    """Straight-through in the forward; the backward's incoming gradient rounded to int8 per
    micro-batch (a quarter of dim 0), as the engine's requantize of an error."""
    class GQ(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            out = torch.empty_like(g)
            step = max(1, g.shape[0] // 4)
            for c0 in range(0, g.shape[0], step):
                gg = g[c0:c0 + step]
                s = _pow2_scale(gg.abs().max())
                u = torch.rand_like(gg) if stochastic else 0.5
                out[c0:c0 + step] = torch.clamp(torch.floor(gg / s + u), -127, 127) * s
            return out

    return GQ.apply


def _softmax7(sm):
    def f(x, dim=-1, **kw):
        p = sm(x, dim, **kw)
        return p + (torch.floor(p * 128 + 0.5) / 128 - p).detach()
    return f


def _out_error(stochastic: bool):
    class Q(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z, y):
            ctx.save_for_backward(y)
            return z.view_as(z)

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            out = torch.empty_like(g)
            step = g.shape[0] // 4  # the engine's 4 micro-batches of a batch of 64
            for c0 in range(0, g.shape[0], step):
                gg, yy = g[c0:c0 + step], y[c0:c0 + step]
                s = _pow2_scale(gg.abs().max())
                u = torch.rand_like(gg) if stochastic else 0.5
                q = torch.clamp(torch.floor(gg / s + u), -127, 127)
                rows = torch.arange(len(yy))
                q[rows, yy] = 0
                q[rows, yy] = torch.clamp(-q.sum(1), min=-127)
                out[c0:c0 + step] = q * s
            return out, None

    ce = torch.nn.functional.cross_entropy
    return lambda z, y, *a, **k: ce(Q.apply(z, y), y, *a, **k)


def _apply(part: str) -> None:
    F = torch.nn.functional
    sr = part.endswith("-sr")
    base = part[:-3] if sr else part
    if part == "softmax7":
        torch.softmax = _softmax7(torch.softmax)
    elif part == "int8fwd":
        lin = F.linear
        F.linear = lambda x, w, b=None: lin(_fq(x), _fq(w), b)
    elif part in ("outerr", "outerr-sr"):
        F.cross_entropy = _out_error(sr)
    elif base == "linq":
        q, lin = _gq(sr), F.linear
        F.linear = lambda x, w, b=None: q(lin(q(x), w, b))
    elif base == "softq":
        q, sm = _gq(sr), torch.softmax
        torch.softmax = lambda x, dim=-1, **kw: sm(q(x), dim, **kw)
    elif base == "normq":
        from daisychain.engine import attention

        q, rms = _gq(sr), attention._torch().RMSNorm.forward
        attention._torch().RMSNorm.forward = lambda self, x: q(rms(self, x))
    elif part != "none":
        raise SystemExit(f"unknown variant {part!r}: none, softmax7, int8fwd, outerr[-sr], linq[-sr], "
                         "softq[-sr], normq[-sr], joined by +")


def main() -> None:
    variant, argv = sys.argv[1], sys.argv[2:]
    for part in variant.split("+"):
        _apply(part)
    from daisychain.cli import main as cli_main

    sys.exit(cli_main(argv))


if __name__ == "__main__":
    main()
