"""DaisyChain: train one small neural network together on the devices you already have.

Subpackages: ``units`` (the verified INT8 units and their tables), ``exporter`` (trains and
verifies the units, writes ``luts/``), ``engine`` (numpy training engine), ``server``
(aiohttp signaling), ``peer`` (headless aiortc worker), ``desktop`` (pywebview window), ``cluster``
(torch.distributed/Gloo ranks), ``export`` (checkpoints as .safetensors / .onnx /
``torch_model``), ``api`` (the Python API below) and ``task`` (tasks of your own).

The Python API (docs/API.md): ``Model``, ``train``, ``resume``, ``join``, ``Task`` and the
layer objects ``Dense``, ``Conv``, ``Pool``; bad values raise ``SettingsError`` in one line.
"""

from daisychain.meta import ENGINE_VERSION, __version__, package_path  # noqa: F401


def torch_model(path, weights: str = "int8"):
    """A checkpoint (``.pt``) or exported ``.safetensors`` as a ``torch.nn.Module`` with a
    ``predict(x)`` helper; see :func:`daisychain.export.torch_model`."""
    from daisychain.export import torch_model as _torch_model

    return _torch_model(path, weights)


_API = ("Model", "Dense", "Conv", "Pool", "Result", "SettingsError", "train", "resume", "join")


def __getattr__(name: str):
    """The API's names (``daisychain.train`` ...), imported when first used, so that
    ``import daisychain`` stays light for the commands."""
    if name in _API:
        from daisychain import api

        return getattr(api, name)
    if name == "Task":
        from daisychain.task import Task

        return Task
    raise AttributeError(f"module 'daisychain' has no attribute {name!r}")
