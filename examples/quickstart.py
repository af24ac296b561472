"""DaisyChain from Python, cell by cell (run it whole, or paste the cells into a notebook).

    python examples/quickstart.py [OUT_FOLDER]

Trains the embedded digits, evaluates, predicts, saves, exports, reloads the export in
torch, resumes, and trains a task of your own (examples/my_task.py). Every hash it prints is
the one the command line prints for the same settings (``daisychain train --layers 64
--steps 200``). Its last line is a JSON summary (tests/engine/test_examples.py reads it).
"""

# %% Setup: where the files go
import json
import sys
from pathlib import Path

import daisychain as dc

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("quickstart-out")
OUT.mkdir(parents=True, exist_ok=True)

# %% A model from the registry's layers: objects, or the --layers string "64"
model = dc.Model([dc.Dense(64)])

# %% Train it alone on the embedded 8x8 digits (the same bits as `daisychain train`)
result = dc.train(model, "digits", steps=200, seed=0)
print("params-sha256:", result.params_sha256)
print(f"test accuracy: {result.accuracy:.2%}  last loss: {result.loss:.4f}")

# %% Evaluate on both splits
print("train:", result.evaluate("train"), " test:", result.evaluate("test"))

# %% Predict: rows of 64 pixel intensities (0..16) -> class ids
from sklearn.datasets import load_digits  # noqa: E402 (a notebook cell)

digits = load_digits()
pred = result.predict(digits.data[:8])
print("predicted:", pred.tolist(), " true:", digits.target[:8].tolist())

# %% Save the run's state (.pt, what every command's --resume reads) and export it
result.save(OUT / "digits.pt")
exported = result.export(OUT / "digits.safetensors")
print("exported:", exported["path"], exported["bytes"], "bytes")

# %% The export in plain torch
torch_model = dc.torch_model(OUT / "digits.safetensors")
print("torch predicts:", torch_model.predict(digits.data[:8]).tolist())

# %% Go on from the checkpoint to 300 steps: the hash of an uninterrupted 300-step run
more = dc.resume(OUT / "digits.pt", steps=300)
print("resumed to 300 steps:", more.params_sha256)

# %% A task of your own: regression on a small table with the mean squared error
sys.path.insert(0, str(Path(__file__).resolve().parent))
from my_task import MyTask  # noqa: E402

regression = dc.train(None, MyTask(), steps=300)
x_train, y_train, x_test, y_test = MyTask().data()
print(f"my task: test mse {regression.test_mse:.4f}; first predictions",
      regression.predict(x_test[:3]).ravel().round(3).tolist(), "true", y_test[:3].round(3).tolist())

# %% A bad value gets one line, with the command line's own words
try:
    dc.train(model, "digits", lr=5)
except dc.SettingsError as exc:
    print("refused:", exc)

print(json.dumps({"digits": result.params_sha256, "accuracy": result.accuracy,
                  "predicted": pred.tolist(), "resumed": more.params_sha256,
                  "my_task": regression.params_sha256, "my_task_mse": regression.test_mse,
                  "files": sorted(p.name for p in OUT.iterdir())}))
