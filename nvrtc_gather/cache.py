"""The on-disk kernel cache: compiled GPU code only, keyed by everything that shapes it.

Guarantees (none depends on the lock):
- an entry is published by write-to-temp + fsync + os.replace, so a reader sees a whole
  old entry, a whole new one, or none; a process killed mid-write leaves only a temp
  file, which no reader ever opens;
- every read is verified (magic, schema, the key it was stored under, payload length,
  SHA-256 of the payload) and any failure is a miss: the caller recompiles and replaces;
- only GPU code (cubin/PTX) is stored and read back, never host code;
- the directory is 0700 and entries 0600; a directory we do not own, or one that others
  may write to (without the sticky bit), is not used: kernels stay in memory, with one
  warning. So does a read-only or full disk.
The lock (flock on ``<entry>.lock``) only stops concurrent processes compiling the same
entry twice.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import struct
import tempfile
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from . import settings

SCHEMA = 1
MAGIC = b"NVRTCGATHER\0"
_HEADER = struct.Struct("<12sI32sQ32s")  # magic, schema, key digest, payload length, payload sha256
SUFFIX = ".bin"


def make_key(fields: Iterable[tuple[str, str | bytes]]) -> str:
    """SHA-256 over labelled, length-prefixed fields: no two field lists share a key
    (unlike a plain concatenation), and nothing salted (unlike Python's hash())."""
    h = hashlib.sha256()
    for label, value in fields:
        data = value.encode() if isinstance(value, str) else value
        lab = label.encode()
        h.update(struct.pack("<Q", len(lab)) + lab + struct.pack("<Q", len(data)) + data)
    return h.hexdigest()


def encode_entry(key: str, payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, SCHEMA, bytes.fromhex(key), len(payload), hashlib.sha256(payload).digest()) + payload


def decode_entry(key: str, blob: bytes) -> bytes | None:
    """The payload if ``blob`` is a whole, intact entry stored under ``key``; else None."""
    if len(blob) < _HEADER.size:
        return None
    magic, schema, digest, length, checksum = _HEADER.unpack_from(blob)
    payload = blob[_HEADER.size:]
    if magic != MAGIC or schema != SCHEMA or digest != bytes.fromhex(key):
        return None
    if length != len(payload) or hashlib.sha256(payload).digest() != checksum:
        return None
    return payload


@dataclass(frozen=True)
class EntryInfo:
    path: Path
    size: int
    valid: bool


class DiskCache:
    """Compiled kernels under one directory. ``get`` never raises for a bad or unreadable
    entry (it returns None); ``put`` never raises for an unwritable directory (it warns
    once and returns False). Safe for many threads and processes at once."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._usable: bool | None = None
        self._warned = False

    # -- locating -----------------------------------------------------------------
    def path_for(self, name: str, key: str) -> Path:
        return self.directory / f"{name}-{key}{SUFFIX}"

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"nvrtc_gather: not using the kernel cache at {self.directory} ({why}); "
                f"kernels are kept in memory only. Set {settings.CACHE_DIR_ENV} to a private "
                f"writable directory, or {settings.DISABLE_CACHE_ENV}=1 to silence this.",
                RuntimeWarning,
                stacklevel=4,
            )

    def usable(self) -> bool:
        """Create the directory (0700) if needed and check it is safe to trust."""
        if self._usable is None:
            self._usable = self._check_directory()
        return self._usable

    def _check_directory(self) -> bool:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = self.directory.stat()
        except OSError as exc:
            self._warn(f"cannot create it: {exc.strerror or exc}")
            return False
        if not stat.S_ISDIR(st.st_mode):
            self._warn("it is not a directory")
            return False
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            self._warn(f"it is owned by uid {st.st_uid}, not by this user")
            return False
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            self._warn("others may write to it")
            return False
        return True

    # -- reading and writing -------------------------------------------------------
    def get(self, name: str, key: str) -> bytes | None:
        if not self.usable():
            return None
        try:
            blob = self.path_for(name, key).read_bytes()
        except OSError:
            return None
        return decode_entry(key, blob)

    def put(self, name: str, key: str, payload: bytes) -> bool:
        """Publish atomically. False (after one warning) when the disk refuses."""
        if not self.usable():
            return False
        final = self.path_for(name, key)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=self.directory)  # 0600
            with os.fdopen(fd, "wb") as f:
                f.write(encode_entry(key, payload))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            tmp = None
            return True
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT):
                self._warn(exc.strerror or str(exc))
            else:
                self._warn(str(exc))
            return False
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def discard(self, name: str, key: str) -> None:
        """Remove an entry that decoded but would not load (so the next put replaces it)."""
        try:
            self.path_for(name, key).unlink()
        except OSError:
            pass

    @contextmanager
    def lock(self, name: str, key: str) -> Iterator[None]:
        """Advisory cross-process lock for one entry; a no-op if it cannot be taken."""
        fd = None
        if self.usable():
            try:
                fd = os.open(str(self.path_for(name, key)) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                if fd is not None:
                    os.close(fd)
                fd = None
        try:
            yield
        finally:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    # -- maintenance (CLI) ---------------------------------------------------------
    def entries(self) -> list[EntryInfo]:
        out = []
        if not self.directory.is_dir():
            return out
        for p in sorted(self.directory.glob(f"*{SUFFIX}")):
            key = p.stem.rsplit("-", 1)[-1]
            try:
                blob = p.read_bytes()
                valid = len(key) == 64 and decode_entry(key, blob) is not None
                out.append(EntryInfo(p, len(blob), valid))
            except (OSError, ValueError):
                out.append(EntryInfo(p, 0, False))
        return out

    def clear(self) -> int:
        """Remove every entry, lock and leftover temp file; returns how many files went."""
        n = 0
        if not self.directory.is_dir():
            return n
        for p in self.directory.iterdir():
            if p.name.endswith((SUFFIX, ".lock", ".tmp")):
                try:
                    p.unlink()
                    n += 1
                except OSError:
                    pass
        return n


_caches: dict[Path, DiskCache] = {}


def current() -> DiskCache | None:
    """The cache chosen by the environment right now, or None when disabled."""
    if not settings.disk_cache_enabled():
        return None
    d = settings.cache_dir()
    c = _caches.get(d)
    if c is None:
        c = _caches.setdefault(d, DiskCache(d))
    return c
