"""DaisyChain: train one small neural network together on the devices you already have.

Subpackages: ``units`` (the verified INT8 units and their tables), ``exporter`` (trains and
verifies the units, writes ``luts/``), ``engine`` (numpy training engine), ``server``
(aiohttp signaling), ``peer`` (headless aiortc worker), ``desktop`` (pywebview window), ``cluster``
(torch.distributed/Gloo ranks), ``export`` (checkpoints as .safetensors / .onnx /
``torch_model``).
"""

from importlib import resources

__version__ = "0.1.0"

#: Version of the training arithmetic. Two peers train together only when it is equal;
#: bump it on any change that can change a parameter bit.
ENGINE_VERSION = "2"


def torch_model(path, weights: str = "int8"):
    """A checkpoint (``.pt``) or exported ``.safetensors`` as a ``torch.nn.Module`` with a
    ``predict(x)`` helper; see :func:`daisychain.export.torch_model`."""
    from daisychain.export import torch_model as _torch_model

    return _torch_model(path, weights)


def package_path(*parts: str):
    """Path of a file shipped inside the package (``webui/``, ``shaders/``, ``luts/``...)."""
    return resources.files("daisychain").joinpath(*parts)
