"""A task of your own: regression on a small table, learned with the mean squared error.

Copy this file and change the three members. Run it alone, in a room, or from Python:

    daisychain train --task examples.my_task:MyTask --steps 300
    daisychain demo --peers 2 --task examples.my_task:MyTask --steps 300     # the same hash
    daisy-peer --server http://HOST:8787 --create-room --task examples.my_task:MyTask
    python -c "import daisychain as dc; from examples.my_task import MyTask; \\
               print(dc.train(None, MyTask(), steps=300).params_sha256)"

(from the folder that holds ``examples/``: ``--task`` imports the module as ``python -m``
does). The table is scikit-learn's diabetes set (442 patients, 10 measurements, one
disease-progression number), which ships inside scikit-learn: nothing is downloaded.
"""

import numpy as np


class MyTask:
    #: the --layers string: two hidden layers of 32 (input and output widths come from data())
    layers = "32,32"
    #: "mse" for numbers to predict, "cross_entropy" for class ids
    loss = "mse"

    def data(self):
        """(x_train, y_train, x_test, y_test) as numpy arrays: x (rows, features), y (rows,)
        or (rows, targets) for mse. Every fifth row is a test row (a fixed split: the same
        arrays, and so the same dataset fingerprint, on every machine)."""
        from sklearn.datasets import load_diabetes

        table = load_diabetes()
        x = np.asarray(table.data, np.float64)  # already centred and scaled by scikit-learn
        y = (np.asarray(table.target, np.float64) - 152.0) / 77.0  # about mean 0, spread 1
        test = np.arange(len(x)) % 5 == 0
        return x[~test], y[~test], x[test], y[test]
