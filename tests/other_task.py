"""examples/my_task.py with other targets: a peer that brings it to a room training MyTask
is refused in words (tests/mesh/test_my_task_demo.py)."""

from examples.my_task import MyTask


class OtherTask(MyTask):
    name = "mytask"  # the same task name: only the data differ

    def data(self):
        x_train, y_train, x_test, y_test = super().data()
        return x_train, y_train + 1.0, x_test, y_test + 1.0
