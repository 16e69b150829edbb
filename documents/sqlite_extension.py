"""Loading sqlite-vec into SQLite connections: the one place that reaches into CPython's sqlite3.

Django's SQLite backend uses the standard library's `sqlite3`. Where Python was built with loadable
extensions, `Connection.enable_load_extension` loads sqlite-vec the documented way. Many builds
(pyenv's default, for one, as on this project's machines) leave that method out although the
SQLite library underneath can load extensions; there the two C calls it would have made are made
through ctypes, on the `sqlite3 *` handle that CPython keeps as the first field after the object
header of its `pysqlite_Connection` struct. That layout is CPython's private detail, so the reach is
taken only on the CPython versions it was checked on (`CHECKED_PYTHONS`), only after the handle is
confirmed to be this connection's (SQLite reports the same database file for it), and the symbols
are looked up through the `_sqlite3` module itself, so they are the very library the connection
lives in. Anything else, and sqlite-vec is simply not loaded: search falls back to the exact scan
(`documents.index.vector_backend`). `tests/documents/test_index.py` fails loudly if this stops working.
"""

from __future__ import annotations

import ctypes
import logging
import platform
import sqlite3
import sys
from typing import Any

logger = logging.getLogger(__name__)

# CPython versions whose pysqlite_Connection starts with PyObject_HEAD then `sqlite3 *db`.
CHECKED_PYTHONS = {(3, 10), (3, 11), (3, 12), (3, 13)}


def load_sqlite_vec(raw: sqlite3.Connection) -> bool:
    """Load sqlite-vec into `raw` (a sqlite3 connection); True if its functions are now there."""
    try:
        import sqlite_vec
    except ImportError:
        return False
    path = sqlite_vec.loadable_path()
    try:
        if hasattr(raw, "enable_load_extension"):
            raw.enable_load_extension(True)
            try:
                raw.load_extension(path)
            finally:
                raw.enable_load_extension(False)
        elif not _load_through_ctypes(raw, path):
            return False
        raw.execute("select vec_version()").fetchone()
        return True
    except Exception:
        logger.warning("sqlite-vec could not be loaded; vector search uses the exact scan", exc_info=True)
        return False


def _load_through_ctypes(raw: sqlite3.Connection, path: str) -> bool:
    if platform.python_implementation() != "CPython" or sys.version_info[:2] not in CHECKED_PYTHONS:
        return False
    import _sqlite3

    lib = ctypes.CDLL(_sqlite3.__file__)
    try:
        enable, load, filename = lib.sqlite3_enable_load_extension, lib.sqlite3_load_extension, lib.sqlite3_db_filename
    except AttributeError:  # built with SQLITE_OMIT_LOAD_EXTENSION, or the symbols are not exported
        return False
    enable.argtypes, enable.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
    load.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
    load.restype = ctypes.c_int
    filename.argtypes, filename.restype = [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_char_p
    handle = _handle_of(raw)
    if not handle or not _same_database(raw, handle, filename):
        return False
    error = ctypes.c_char_p()
    if enable(handle, 1) != 0:
        return False
    try:
        status = load(handle, path.encode(), None, ctypes.byref(error))
    finally:
        enable(handle, 0)
    if status != 0:
        logger.warning("sqlite-vec: %s", (error.value or b"").decode(errors="replace"))
        return False
    return True


def _handle_of(raw: sqlite3.Connection) -> int | None:
    return ctypes.c_void_p.from_address(id(raw) + 2 * ctypes.sizeof(ctypes.c_void_p)).value


def _same_database(raw: sqlite3.Connection, handle: int, filename: Any) -> bool:
    """Whether `handle` is `raw`'s own: SQLite names the same file for its main database."""
    try:
        expected = next(row[2] for row in raw.execute("pragma database_list") if row[1] == "main")
        reported = filename(handle, b"main")
    except Exception:
        return False
    return (reported or b"").decode() == (expected or "")
