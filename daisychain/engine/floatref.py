"""The same model in plain float32 torch, for accuracy comparison only (``train --float``):
same initial parameters, same micro-batch schedule, torch's Adam."""

from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from daisychain.engine.augment import lr_at, step_inputs
from daisychain.engine.layers import torch_sequential
from daisychain.engine.model import ParamLayout, init_params, seq_targets
from daisychain.engine.trainer import Schedule


def float_model(spec, theta: np.ndarray) -> torch.nn.Sequential:
    """The registry's float twin of the spec (``layers.torch_sequential``) holding theta."""
    model = torch_sequential(spec)
    layout = ParamLayout(spec)
    model.load_state_dict({name[len("layers."):]: torch.tensor(v, dtype=torch.float32)
                           for name, v in zip(layout.names, layout.views(theta))})
    return model


def train_float(rs, quiet: bool = False) -> dict:
    torch.manual_seed(rs.hp.seed)
    model = float_model(rs.spec, init_params(rs.spec, rs.hp.seed))
    opt = torch.optim.Adam(model.parameters(), lr=rs.hp.lr, betas=(rs.hp.beta1, rs.hp.beta2),
                           eps=rs.hp.eps, weight_decay=0.0)
    sched = Schedule(len(rs.ds.y_train), rs.hp)
    dense = rs.ds.kind == "dense"  # image pixels go in as uint8: the model's input module reads them
    conv = (lambda a: torch.tensor(a, dtype=torch.float32)) if dense else torch.tensor
    loss_v = float("nan")
    mse = rs.spec.loss == "mse"
    for step in tqdm(range(rs.steps), desc="train --float", disable=quiet, leave=False):
        xs, ys = step_inputs(rs.ds, rs.hp, sched, step, range(rs.hp.n_micro))  # augmented as the engine's
        x = conv(xs.reshape((-1,) + xs.shape[2:]))
        for group in opt.param_groups:  # the run's learning-rate schedule
            group["lr"] = lr_at(rs.hp, step)
        if mse:  # the engine's gradient is that of 1/2 * sum_k (z_k - y_k)**2, mean over rows
            y = torch.tensor(ys.reshape(-1, ys.shape[-1]), dtype=torch.float32)
            loss = 0.5 * ((model(x) - y) ** 2).sum(1).mean()
        elif rs.spec.seq:  # every position predicts the next token, as the engine's
            y = torch.tensor(seq_targets(xs, ys).reshape(-1), dtype=torch.long)
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        else:
            y = torch.tensor(ys.reshape(-1), dtype=torch.long)
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_v = float(loss.detach())
    with torch.no_grad():
        out = torch.cat([model(conv(rs.ds.x_test[i:i + 1024])) for i in range(0, len(rs.ds.x_test), 1024)])
        if rs.spec.seq:
            out = out[:, -1]  # the token after the full window
        out = out.double().numpy()
    if mse:
        return {"task": rs.ds.task, "steps": rs.steps, "seed": rs.hp.seed, "float": True,
                "accuracy": 0.0, "test_mse": float(np.mean((out - rs.ds.y_test) ** 2)),
                "test_loss": float(np.mean((out - rs.ds.y_test) ** 2)),
                "loss": 2 * loss_v / rs.ds.y_test.shape[1]}
    y = np.asarray(rs.ds.y_test, np.int64)
    m = out.max(axis=1)
    lse = m + np.log(np.exp(out - m[:, None]).sum(axis=1))
    return {"task": rs.ds.task, "steps": rs.steps, "seed": rs.hp.seed, "float": True,
            "accuracy": float((out.argmax(1) == y).mean()), "loss": loss_v,
            "test_loss": float(np.mean(lse - out[np.arange(len(y)), y])) if len(y) else 0.0}
