"""The single-process reference trainer, and the pieces every peer shares with it: the
step schedule, the run identity, the fixed-point aggregation and the parameter hash."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from daisychain.meta import ENGINE_VERSION
from daisychain.engine.adam import AdamState, adam_step
from daisychain.engine.augment import step_inputs
from daisychain.engine.detmath import pow2
from daisychain.engine.data import Dataset
from daisychain.engine.model import Engine, ParamLayout, Result, init_params
from daisychain.engine.schedule import Schedule
from daisychain.engine.spec import Hyper, ModelSpec, SpecError, dumps_canonical
from daisychain.engine.threads import ThreadedGrad
from daisychain.units.luts import LutSet


def params_sha256(theta: np.ndarray) -> str:
    """SHA-256 of the canonical parameter bytes: every tensor in canonical order (by layer,
    weight then bias), row-major, float64 little-endian, concatenated."""
    return hashlib.sha256(np.ascontiguousarray(theta, "<f8").tobytes()).hexdigest()


def run_identity(spec: ModelSpec, hp: Hyper, ds: Dataset, luts: LutSet) -> dict:
    out = {"model": spec.to_json(), "hyper": hp.to_json(), "dataset": ds.fingerprint,
           "task": ds.task, "luts": luts.manifest_sha256, "engine": ENGINE_VERSION,
           "seed": hp.seed}
    if spec.uses_exp:  # the exp unit is not in manifest_sha256: a model that reads it names it
        out["exp_lut"] = luts.exp_sha256
    if spec.seq:  # its output error rounds stochastically (engine/sround.py): an engine that
        out["output_rounding"] = "stochastic"  # rounded it half up has another run id
        out["error_rounding"] = "stochastic"  # and so do its backward's errors (sround.requantize_errors)
    return out


def run_id(identity: dict) -> str:
    return hashlib.sha256(dumps_canonical(identity).encode()).hexdigest()[:16]


def identity_differences(mine: dict, theirs: dict) -> list[str]:
    """Human-readable list of what differs between two run identities."""
    names = {"model": "model spec", "hyper": "hyperparameters", "dataset": "dataset fingerprint",
             "luts": "LUT manifest", "engine": "engine version", "seed": "seed", "task": "task",
             "exp_lut": "exp table", "output_rounding": "output error rounding",
             "error_rounding": "backward error rounding"}
    out = []
    for k, label in names.items():
        if mine.get(k) != theirs.get(k):
            a, b = mine.get(k), theirs.get(k)
            if isinstance(a, dict) or isinstance(b, dict):
                out.append(f"{label} differs")
            else:
                out.append(f"{label}: {a} here, {b} in the run")
    return out


def grad_limit(hp: Hyper) -> float:
    """Per-micro-batch clamp L = floor(2**51 / n_micro): any sum of a step's contributions
    stays below 2**51 in magnitude, exact in int64 and in JS Numbers, and x + 1/2 is exact."""
    return float((2**51) // hp.n_micro)


@dataclass
class TrainState:
    theta: np.ndarray
    adam: AdamState
    step: int = 0


class Trainer:
    """Holds one replica: parameters, Adam state, schedule. ``contribute`` is what a peer
    does with its assigned micro-batches; ``apply`` is what every replica does with the sum."""

    def __init__(self, spec: ModelSpec, hp: Hyper, ds: Dataset, luts: LutSet, gemm: str = "fast",
                 threads: int = 1):
        hp.validate()
        spec.validate()
        from daisychain.engine.settings import check_size
        check_size(spec, hp)
        if hp.augment_shift and ds.kind != "image":
            raise SpecError("--augment-shift applies to the image task")
        self.spec, self.hp, self.ds, self.luts = spec, hp, ds, luts
        self.engine = Engine(spec, luts, gemm)
        # threads > 1: a step's micro-batches on that many processes, same bits (engine/threads.py)
        # (a worker process holds the training set and makes its share's inputs itself: only a
        # step's micro-batch indices cross to it, engine/procs.py)
        self.threads = ThreadedGrad(self.engine, lambda: Engine(spec, luts, gemm), threads,
                                    procs=(spec, luts, gemm), data=self._worker_data(ds, hp))
        self.layout = ParamLayout(spec)
        self.schedule = Schedule(len(ds.y_train), hp)
        theta = init_params(spec, hp.seed)
        self.state = TrainState(theta, AdamState.zeros(theta.size))
        self.identity = run_identity(spec, hp, ds, luts)
        self.run_id = run_id(self.identity)
        self.limit = grad_limit(hp)

    @property
    def n_tasks(self) -> int:
        """The tasks of a step the run protocol hands out: the micro-batches (a
        LocalTrainer's are its replicas)."""
        return self.hp.n_micro

    def contribution_error(self, ints: np.ndarray, micro, step: int | None = None) -> str | None:
        """Why a received contribution cannot be one beyond its size and clamp bound (which
        the coordinator checks): never, for a synchronous run (LocalTrainer's can)."""
        return None

    @property
    def total_size(self) -> int:
        """Entries of a contribution and of a step's total: one per parameter."""
        return self.layout.size

    @property
    def theta(self) -> np.ndarray:
        return self.state.theta

    @property
    def state_sizes(self) -> tuple[int, int]:
        """(values of the state's "theta" part, of each moment part) on the wire (STATE)."""
        return self.layout.size, self.layout.size

    def wire_state(self) -> tuple:
        """A copy of the state as the STATE frame carries it: (step, theta, m, v, b1t, b2t)."""
        st = self.snapshot()
        return st.step, st.theta, st.adam.m, st.adam.v, st.adam.b1t, st.adam.b2t

    def state_of(self, step: int, theta, m, v, b1t: float, b2t: float) -> "TrainState":
        """The state :meth:`wire_state`'s arrays (checked by the caller) stand for."""
        return TrainState(theta, AdamState(m, v, int(step), float(b1t), float(b2t)), int(step))

    def contribute(self, micro_ids: list[int] | np.ndarray, step: int | None = None,
                   theta: np.ndarray | None = None) -> Result:
        """Fixed-point gradient sum of the given micro-batches of a step (default: current),
        on ``theta`` (default: the replica's; a copy lets a compute thread never see the
        replica change under it)."""
        step = self.state.step if step is None else step
        theta = self.state.theta if theta is None else theta
        ids = np.asarray(micro_ids, np.int64)
        if ids.size == 0:
            return Result(np.zeros(self.layout.size, np.int64), np.zeros(0), np.zeros(0, np.int64))
        return self.threads.grad_of(len(ids), lambda a, b: self.inputs(step, ids[a:b]), theta,
                                    self.hp.grad_frac_bits, self.limit, at=(step, ids))

    @staticmethod
    def _worker_data(ds: Dataset, hp: Hyper) -> tuple | None:
        """What a compute worker process needs to make a step's inputs as :meth:`inputs` does
        (the training arrays, the image shape, the hyper-parameters), or None."""
        x, y = getattr(ds, "x_train", None), getattr(ds, "y_train", None)
        if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
            return None
        return x, y, ds.image_shape if hp.augment_shift else None, hp

    def inputs(self, step: int, micro_ids) -> tuple[np.ndarray, np.ndarray]:
        """x (n, b, ...), y (n, b) of the given micro-batches of a step, augmented when the
        run augments (``daisychain.engine.augment.step_inputs``)."""
        return step_inputs(self.ds, self.hp, self.schedule, step, micro_ids)

    def grad_scaling(self) -> tuple[float, float]:
        """(gscale, gdiv) with mean gradient = total * gscale / gdiv: total * 2**-S / n_micro,
        one exact scaling when n_micro is a power of two (both steps are exact then)."""
        n = self.hp.n_micro
        if n & (n - 1) == 0:
            return float(pow2(-self.hp.grad_frac_bits - (n.bit_length() - 1))), 1.0
        return float(pow2(-self.hp.grad_frac_bits)), float(n)

    def mean_grad(self, total: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The averaged gradient from the integer total: total * 2**-S / n_micro."""
        gscale, gdiv = self.grad_scaling()
        g = np.multiply(total, gscale, out=out, dtype=np.float64)
        return g if gdiv == 1.0 else np.divide(g, gdiv, out=g)

    def apply(self, total: np.ndarray) -> None:
        """Adam on the mean gradient of the integer total (fused into one pass where
        adam_step can; the same bits as mean_grad then adam_step)."""
        total = np.asarray(total)
        gscale, gdiv = self.grad_scaling()
        adam_step(self.state.theta, self.state.adam, total.reshape(-1), self.hp, gscale, gdiv)
        self.state.step += 1

    def snapshot(self) -> TrainState:
        """A copy of the replica's state (parameters, Adam moments and step)."""
        st, a = self.state, self.state.adam
        return TrainState(st.theta.copy(), AdamState(a.m.copy(), a.v.copy(), a.step, a.b1t, a.b2t), st.step)

    def load(self, state: TrainState) -> None:
        """Replace the replica's state with a copy of ``state`` (theta is written in place)."""
        st, a = self.state, state.adam
        st.theta[:] = state.theta
        st.adam.m, st.adam.v = np.array(a.m, np.float64), np.array(a.v, np.float64)
        st.adam.b1t, st.adam.b2t = float(a.b1t), float(a.b2t)
        st.adam.step = st.step = int(state.step)

    def accuracy(self, split: str = "test") -> float:
        """The share of rows whose class is right (0.0 for an "mse" model: it has no classes;
        see :meth:`mse`)."""
        if self.spec.loss == "mse":
            return 0.0
        x = self.ds.x_test if split == "test" else self.ds.x_train
        y = self.ds.y_test if split == "test" else self.ds.y_train
        pred = self.engine.predict(self.state.theta, x, self.hp.micro_batch)
        return float((pred == y).mean()) if len(y) else 0.0

    def test_loss(self, split: str = "test") -> float:
        """The mean loss over a split of the class after a full window (display only, never
        fed back): cross-entropy of the logits (a sequence model's last position), an "mse"
        model's mean squared error; 0.0 for an empty split."""
        if self.spec.loss == "mse":
            return self.mse(split)
        x = self.ds.x_test if split == "test" else self.ds.x_train
        y = self.ds.y_test if split == "test" else self.ds.y_train
        if not len(y):
            return 0.0
        z = self.engine.outputs(self.state.theta, x, self.hp.micro_batch)
        m = z.max(axis=1)
        lse = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
        return float(np.mean(lse - z[np.arange(len(y)), np.asarray(y, np.int64)]))

    def mse(self, split: str = "test") -> float | None:
        """An "mse" model's mean squared error over a split (None for a classifier)."""
        if self.spec.loss != "mse":
            return None
        x = self.ds.x_test if split == "test" else self.ds.x_train
        y = self.ds.y_test if split == "test" else self.ds.y_train
        if not len(y):
            return 0.0
        d = self.engine.outputs(self.state.theta, x, self.hp.micro_batch) - y
        return float(np.mean(d * d))

    def params_sha256(self) -> str:
        return params_sha256(self.state.theta)


def assign(n_micro: int, workers: int, how: str, step: int, seed: int,
           capacities: list[float] | None = None) -> list[list[int]]:
    """Split a step's micro-batch indices over ``workers`` simulated peers."""
    if workers < 1:
        raise ValueError("--workers must be >= 1")
    ids = list(range(n_micro))
    if how == "round-robin":
        return [ids[k::workers] for k in range(workers)]
    if how == "random":
        rng = np.random.default_rng([seed, step])  # the assignment never feeds the parameters
        owner = rng.integers(0, workers, n_micro)
        return [[j for j in ids if owner[j] == k] for k in range(workers)]
    if how == "capacity":
        caps = capacities or [1.0 + (k % 3) for k in range(workers)]
        return capacity_split(ids, caps)
    raise ValueError(f"unknown assignment {how!r}; use round-robin, random or capacity")


def capacity_split(ids: list[int], caps: list[float]) -> list[list[int]]:
    """Contiguous shares proportional to capacity (largest remainder)."""
    total = sum(caps)
    n = len(ids)
    exact = [c / total * n for c in caps]
    counts = [int(e) for e in exact]
    for k in sorted(range(len(caps)), key=lambda k: (counts[k] - exact[k], k))[: n - sum(counts)]:
        counts[k] += 1
    out, i = [], 0
    for c in counts:
        out.append(ids[i:i + c])
        i += c
    return out
