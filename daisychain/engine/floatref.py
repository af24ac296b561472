"""The same model in plain float32 torch, for accuracy comparison only (``train --float``):
same initial parameters, same micro-batch schedule, torch's Adam."""

from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from daisychain.engine.augment import lr_at, step_inputs
from daisychain.engine.model import ParamLayout, init_params
from daisychain.engine.trainer import Schedule


class FloatModel(torch.nn.Module):
    def __init__(self, spec, theta: np.ndarray):
        super().__init__()
        self.spec = spec
        layout = ParamLayout(spec)
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.tensor(v, dtype=torch.float32)) for v in layout.views(theta)])

    def forward(self, x):
        pi = 0
        h = x
        for layer in self.spec.layers:
            if layer.type == "embedding":
                h = self.params[pi][h].flatten(1)
                pi += 1
            elif layer.type == "linear":
                h = h @ self.params[pi].T + self.params[pi + 1]
                pi += 2
            else:
                h = torch.relu(h)
        return h


def train_float(rs, quiet: bool = False) -> dict:
    torch.manual_seed(rs.hp.seed)
    model = FloatModel(rs.spec, init_params(rs.spec, rs.hp.seed))
    opt = torch.optim.Adam(model.parameters(), lr=rs.hp.lr, betas=(rs.hp.beta1, rs.hp.beta2),
                           eps=rs.hp.eps, weight_decay=0.0)
    sched = Schedule(len(rs.ds.y_train), rs.hp)
    dense = rs.ds.kind == "dense"
    conv = (lambda a: torch.tensor(a, dtype=torch.float32)) if dense else torch.tensor
    loss_v = float("nan")
    for step in tqdm(range(rs.steps), desc="train --float", disable=quiet, leave=False):
        xs, ys = step_inputs(rs.ds, rs.hp, sched, step, range(rs.hp.n_micro))  # augmented as the engine's
        x = conv(xs.reshape((-1,) + xs.shape[2:]))
        y = torch.tensor(ys.reshape(-1), dtype=torch.long)
        for group in opt.param_groups:  # the run's learning-rate schedule
            group["lr"] = lr_at(rs.hp, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_v = float(loss.detach())
    with torch.no_grad():
        pred = model(conv(rs.ds.x_test)).argmax(1).numpy()
    return {"task": rs.ds.task, "steps": rs.steps, "seed": rs.hp.seed, "float": True,
            "accuracy": float((pred == rs.ds.y_test).mean()), "loss": loss_v}
