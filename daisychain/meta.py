"""The package's own facts, for every module to import without the package's API:
its version, the engine version, and where its shipped files are."""

from importlib import resources

__version__ = "0.1.0"

#: Version of the training arithmetic. Two peers train together only when it is equal;
#: bump it on any change that can change a parameter bit.
ENGINE_VERSION = "2"


def package_path(*parts: str):
    """Path of a file shipped inside the package (``webui/``, ``shaders/``, ``luts/``...)."""
    return resources.files("daisychain").joinpath(*parts)
