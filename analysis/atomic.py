"""Writing output files so that a partial file never carries the final name: write a temporary file in the same
folder, then rename it over the target."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path, write) -> Path:
    """Call `write(binary_stream)` on a temporary file next to `path`, then rename it to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
        os.chmod(temporary, 0o644)  # mkstemp makes it private; these are reports meant to be read
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:  # a failed write (a full disk) names no file
            error.filename = str(path)
        raise
    return path


def write_text_atomically(path, text: str) -> Path:
    return write_atomically(path, lambda stream: stream.write(text.encode("utf-8")))
