"""What a ``--data`` value names, checked before any loader sees it: a local file, a local
folder, or a Hugging Face data set name; and whether a local file holds anything usable.

A value that looks like a path (it has a file suffix, starts with ``/``, ``./``, ``../`` or
``~``, or names something that exists) is a local path, and one that does not exist is said
to not exist (never looked up on the Hub). Only a bare ``name`` or ``owner/name`` that is not
on disk is a Hub name. Any data source (text, images) can use these checks.
"""

from __future__ import annotations

from pathlib import Path

from daisychain.engine.dataset import DataError

#: bytes read from the start of a file to tell text from binary
SNIFF_BYTES = 65536


def looks_like_path(source: str) -> bool:
    """True for ``./x``, ``/x``, ``~/x``, ``../x`` and anything with a file suffix (``x.txt``);
    a Hub name (``name``, ``owner/name``, ``owner/name-v1.2``) has none of these."""
    s = str(source)
    suffix = Path(s).suffix[1:]
    return s.startswith(("/", "./", "../", "~", ".\\")) or (suffix.isalpha() and len(suffix) <= 8)


def source_kind(source: str) -> str:
    """``"file"``, ``"dir"`` or ``"hub"`` for a --data value; DataError when it looks like a
    local path that does not exist (or is neither a file nor a folder)."""
    path = Path(source).expanduser()
    if path.is_file():
        return "file"
    if path.is_dir():
        return "dir"
    if path.exists():
        raise DataError(f"{source}: is neither a regular file nor a folder")
    if looks_like_path(source):
        raise DataError(f"{source}: the file does not exist")
    return "hub"


def check_file(path: str | Path, text: bool = True) -> None:
    """DataError when a local file is empty, or (``text``) binary: a NUL byte in its first
    :data:`SNIFF_BYTES` or bytes that are not UTF-8."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as exc:
        raise DataError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not head:
        raise DataError(f"{path}: the file is empty")
    if not text:
        return
    if b"\0" in head:
        raise DataError(f"{path}: a binary file, not text (it holds NUL bytes)")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the sniff's end
            raise DataError(f"{path}: not UTF-8 text (byte {exc.start} is "
                            f"0x{head[exc.start]:02x})") from None
