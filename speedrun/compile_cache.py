"""Truncated kernels in inductor's compile cache.

Inductor writes the shared objects it compiles into one cache folder shared by every run of the user
(TORCHINDUCTOR_CACHE_DIR, else /tmp/torchinductor_<user>). A compile killed while writing one (Ctrl-C, a killed run,
a timed-out test) can leave a truncated file there, and every later compile that needs that kernel loads it and
fails with `ImportError: <cache>/<xx>/<hash>.so: file too short`. Removing the file is enough: inductor compiles it
again from the source it keeps beside it. No torch import here: the study runner uses this too.
"""

import getpass
import os
import re
import struct
import tempfile
import time
from pathlib import Path

_TRUNCATED = re.compile(r"(/\S+\.so): file too short")
CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache():
    """The folder inductor compiles into, resolved as torch's cache_dir() does (TORCHINDUCTOR_CACHE_DIR made
    absolute, else torchinductor_<user> in the temporary folder) but without importing torch._inductor: that import
    (dynamo with it) is ~1.6 CPU-s and a few seconds of wall above torch's own, in a process that compiles nothing.
    Unlike cache_dir(), it neither creates the folder nor sets the variable."""
    configured = os.environ.get(CACHE_VARIABLE)
    if configured is not None:
        return Path(os.path.abspath(configured))
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):  # no name for this uid (a container's user)
        user = f"uid_{os.getuid()}"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def truncated_kernel(text):
    """The path of the shared object a `file too short` load error in `text` names, or None."""
    found = _TRUNCATED.search(text or "")
    return Path(found.group(1)) if found else None


def cache_holding(path):
    """The compile cache a kernel file lies in: TORCHINDUCTOR_CACHE_DIR when it holds it, else its nearest
    torchinductor_* folder, else the folder above its two-letter bucket."""
    configured = os.environ.get(CACHE_VARIABLE)
    if configured and Path(path).is_relative_to(configured):
        return Path(configured)
    return next((folder for folder in Path(path).parents if folder.name.startswith("torchinductor")),
                Path(path).parent.parent)


def remove_truncated_kernel(path):
    """Removes a truncated kernel file (inductor compiles it again); returns one phrase naming it and its cache, in
    torch's own words too (`<path>: file too short`), so the study runner knows a training script's line of it."""
    Path(path).unlink(missing_ok=True)
    return (f"{path}: file too short (a compile killed while writing it left it truncated in inductor's cache "
            f"{cache_holding(path)}); removed it")


def truncated_kernel_problem(error):
    """For an exception whose chain holds a `file too short` load error: removes the file and returns one line
    saying so; None for any other exception."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        path = truncated_kernel(str(error))
        if path is not None:
            return f"{remove_truncated_kernel(path)}: run again"
        error = error.__cause__ or error.__context__
    return None


_ELF_HEADER = 64  # ELF64: the offsets and counts of the program and section header tables lie within it


def is_truncated_elf(path):
    """Whether a shared object is shorter than its own ELF header says (a write cut short); False for files that
    are not ELF64 at all."""
    try:
        with open(path, "rb") as f:
            header = f.read(_ELF_HEADER)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    if len(header) < _ELF_HEADER:
        return True  # not even a header: created, then killed before it was written
    if header[:4] != b"\x7fELF" or header[4] != 2:
        return False
    order = "<" if header[5] == 1 else ">"
    program_offset, section_offset = struct.unpack_from(order + "QQ", header, 0x20)
    program_size, program_count, section_size, section_count = struct.unpack_from(order + "HHHH", header, 0x36)
    return size < max(program_offset + program_size * program_count, section_offset + section_size * section_count)


def sweep_truncated_kernels(cache, settled_s=120.0):
    """Removes the truncated shared objects of a compile cache not written to for `settled_s` seconds (a compile
    still writing one is left alone); returns the phrases naming what was removed."""
    now = time.time()
    removed = []
    for path in Path(cache).glob("*/*.so"):
        try:
            settled = now - path.stat().st_mtime >= settled_s
        except OSError:
            continue
        if settled and is_truncated_elf(path):
            removed.append(remove_truncated_kernel(path))
    return removed
