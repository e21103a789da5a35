"""The on-disk kernel cache: compiled GPU code only (one image file per module and arch),
keyed by everything that shapes it. Vocabulary: an *image file* is what the cache stores; an
*entry point* is a kernel inside an image (jit/spec.py).

Guarantees (none depends on the lock):
- an image file is published by write-to-temp + fsync + os.replace, so a reader sees a whole
  old file, a whole new one, or none; a process killed mid-write leaves only a temp
  file, which no reader ever opens and which a later ``put`` removes once it is stale;
- every read is verified (regular file, not a symlink, owned by us, magic, schema, the
  key it was stored under, payload length, SHA-256 of the payload) and any failure is a
  miss: the caller recompiles and replaces;
- only GPU code (cubin/PTX) is stored and read back, never host code;
- a file over ``MAX_IMAGE_BYTES`` is refused from its fstat size, before any
  read, and no read takes more than ``MAX_IMAGE_BYTES + 1`` bytes (a file that grows);
- the directory is 0700 and files 0600; a directory we do not own, or one that others
  may write to (without the sticky bit), is not used: kernels stay in memory, with one
  warning. So does a read-only or full disk. (A group-writable directory is used: an
  file someone else wrote is owned by them, and is refused.)
- the cache owns only the names it writes (``name_kind``): image files
  ``{module}-{arch}-{64 hex}.bin``, their locks ``<image>.lock`` and publish temps
  ``.<image>.XXXXXXXX.tmp``. Nothing else in the directory (another program's files,
  subdirectories) is ever read, replaced or removed: ``clear`` / ``verify --fix`` list
  it as foreign and leave it alone.
The lock (flock on ``<image>.lock``) only stops concurrent processes compiling the same
image twice; a lock that cannot be taken in ``LOCK_TIMEOUT_S`` is skipped. Lock files stay
beside their images (removing one that another process waits on would break the mutual
exclusion), and go with them in ``clear`` and ``verify --fix``.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import stat
import struct
import tempfile
import threading
import time
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from .. import settings
from ..errors import CacheLocationError

log = logging.getLogger(__name__)

SCHEMA = 1
MAGIC = b"NVRTCGATHER\0"
_HEADER = struct.Struct("<12sI32sQ32s")  # magic, schema, key digest, payload length, payload sha256
SUFFIX = ".bin"
LOCK_SUFFIX = ".lock"
TMP_SUFFIX = ".tmp"
# Largest file read as an image file. The ops' modules (nvrtc_gather/kernels/) are 30-200 KB
# per arch; a build holding every entry point of a source stays under a few MB. 16 MiB leaves
# ample headroom and bounds what a bad file costs a lookup.
MAX_IMAGE_BYTES = 16 << 20
_READ_CHUNK = 1 << 20
STALE_TMP_S = 15 * 60           # a temp file this old belongs to a writer that died (a write takes ms)
LOCK_TIMEOUT_S = 60.0           # then compile anyway: a stuck holder must not hang everyone


def make_key(fields: Iterable[tuple[str, str | bytes]]) -> str:
    """SHA-256 over labelled, length-prefixed fields: no two field lists share a key
    (unlike a plain concatenation), and nothing salted (unlike Python's hash())."""
    h = hashlib.sha256()
    for label, value in fields:
        data = value.encode() if isinstance(value, str) else value
        lab = label.encode()
        h.update(struct.pack("<Q", len(lab)) + lab + struct.pack("<Q", len(data)) + data)
    return h.hexdigest()


def encode_image_file(key: str, payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, SCHEMA, bytes.fromhex(key), len(payload), hashlib.sha256(payload).digest()) + payload


def image_file_problem(key: str, blob: bytes) -> str | None:
    """Why ``blob`` is not a whole, intact image file stored under ``key`` (None if it is)."""
    if len(blob) < _HEADER.size:
        return "empty" if not blob else "truncated header"
    magic, schema, digest, length, checksum = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        return "not an nvrtc_gather image file"
    if schema != SCHEMA:
        return f"schema {schema}, expected {SCHEMA}"
    try:
        if digest != bytes.fromhex(key):
            return "stored under another key"
    except ValueError:
        return "bad key"
    payload = memoryview(blob)[_HEADER.size:]
    if length != len(payload):
        return "truncated" if length > len(payload) else "trailing bytes"
    if hashlib.sha256(payload).digest() != checksum:
        return "checksum mismatch"
    return None


def decode_image_file(key: str, blob: bytes) -> bytes | None:
    """The payload if ``blob`` is a whole, intact image file stored under ``key``; else None."""
    return None if image_file_problem(key, blob) is not None else blob[_HEADER.size:]


def parse_image_name(filename: str) -> tuple[str, str, str] | None:
    """(module, arch, key) from ``{module}-{arch}-{key}.bin``; None for any other name."""
    if not filename.endswith(SUFFIX) or filename.startswith("."):
        return None
    parts = filename[: -len(SUFFIX)].rsplit("-", 2)
    if len(parts) != 3 or not all(parts):
        return None
    module, arch, key = parts
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        return None
    return module, arch, key


# _publish's temp names: mkstemp(prefix=".<image>.", suffix=".tmp") adds 8 characters of
# [a-z0-9_] (tempfile._RandomNameSequence).
_TEMP_NAME = re.compile(r"\.(?P<image>.+)\.[a-z0-9_]{8}" + re.escape(TMP_SUFFIX), re.ASCII)

IMAGE, LOCK, TEMP = "image", "lock", "temp"
MISSING = "it does not exist"  # DiskCache.directory_problem() of a directory not made yet


def name_kind(filename: str) -> str | None:
    """IMAGE, LOCK or TEMP for the names this cache writes (an image name as
    ``parse_image_name``, that + ``.lock``, ``.<image name>.XXXXXXXX.tmp``); None for
    any other name, which the cache never touches."""
    if parse_image_name(filename) is not None:
        return IMAGE
    if filename.endswith(LOCK_SUFFIX) and parse_image_name(filename[: -len(LOCK_SUFFIX)]) is not None:
        return LOCK
    m = _TEMP_NAME.fullmatch(filename)
    if m is not None and parse_image_name(m.group("image")) is not None:
        return TEMP
    return None


def _is_temp_name(filename: str) -> bool:
    return name_kind(filename) == TEMP


def read_image_file(path: Path) -> tuple[bytes | None, str | None]:
    """(bytes, None), or (None, why not). Never raises. Does not follow a symlink, opens a
    FIFO without blocking, refuses anything but a regular file of ours of at most
    ``MAX_IMAGE_BYTES`` (judged by fstat before reading, and again while reading in
    bounded chunks, never more than ``MAX_IMAGE_BYTES + 1`` bytes, if it grows)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "a symbolic link (not followed)"
        return None, exc.strerror or str(exc)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if st.st_uid != os.geteuid():
            return None, f"owned by uid {st.st_uid}, not by this user"
        if st.st_size > MAX_IMAGE_BYTES:
            return None, _too_large(st.st_size)
        buf = bytearray()
        while len(buf) <= MAX_IMAGE_BYTES:  # read to EOF: the size may change under us, the checksum decides
            chunk = os.read(fd, min(MAX_IMAGE_BYTES + 1 - len(buf), _READ_CHUNK))
            if not chunk:
                break
            buf += chunk
        if len(buf) > MAX_IMAGE_BYTES:
            return None, _too_large(None)
        return bytes(buf), None
    except OSError as exc:
        return None, exc.strerror or str(exc)
    finally:
        os.close(fd)


def _too_large(size: int | None) -> str:
    what = f"{size} bytes" if size is not None else "it grew while being read"
    return f"too large ({what}; an image file is at most {MAX_IMAGE_BYTES} bytes)"


@dataclass(frozen=True)
class ImageFile:
    """One file named like an image file, as ``cache list`` / ``verify`` show it."""

    path: Path
    size: int
    module: str
    arch: str
    key: str
    problem: str | None    # None when the file is intact

    @property
    def valid(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class Scan:
    """One look at the cache directory (``DiskCache.scan``): its names by kind, each sorted."""

    images: list[ImageFile]  # every file named like an image file, verified when asked
    locks: list[str]
    temps: list[str]          # a write in progress, or a writer that died
    foreign: list[str]        # not the cache's names, or a subdirectory: never touched
    error: OSError | None = None  # the directory could not be listed (FileNotFoundError: missing)

    @property
    def orphan_locks(self) -> list[str]:
        have = {i.path.name for i in self.images}
        return [n for n in self.locks if n[: -len(LOCK_SUFFIX)] not in have]


@dataclass(frozen=True)
class Removal:
    """What ``clear`` / ``remove_images`` did: names removed, (name, reason) not removed."""

    removed: list[str]
    failed: list[tuple[str, str]]


class DiskCache:
    """Compiled kernels under one directory. ``get`` never raises for a bad or unreadable
    file (it returns None); ``put`` never raises for an unwritable directory (it warns
    once and returns False). Safe for many threads and processes at once."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.problem: str | None = None   # why the directory is not used, once checked
        self._usable: bool | None = None
        self._warned = False
        self._swept = False
        self._mutex = threading.Lock()

    # -- locating -----------------------------------------------------------------
    def path_for(self, name: str, key: str) -> Path:
        return self.directory / f"{name}-{key}{SUFFIX}"

    def _warn(self, why: str) -> None:
        with self._mutex:
            if self._warned:
                return
            self._warned = True
        log.warning(
            "nvrtc_gather: not using the kernel cache at %s (%s); kernels are kept in memory only. Set %s to "
            "a private writable directory, or %s=1 to silence this.",
            self.directory, why, settings.CACHE_DIR_ENV, settings.DISABLE_CACHE_ENV)

    def usable(self) -> bool:
        """Create the directory (0700) if needed and check it is safe to trust (once)."""
        if self._usable is None:
            self.problem = self.directory_problem(create=True)
            self._usable = self.problem is None
            if self.problem:
                self._warn(self.problem)
        return self._usable

    def directory_problem(self, create: bool = False) -> str | None:
        """Why this directory must not be used (None if it may; ``MISSING`` if it does not
        exist). Follows a symlinked directory and judges its target. Never raises."""
        try:
            if create:
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = self.directory.stat()
        except FileNotFoundError:
            return MISSING
        except FileExistsError:  # mkdir(exist_ok=True) of a path that is a file (/dev/null)
            return "it is not a directory"
        except OSError as exc:  # ENAMETOOLONG, EACCES on a parent, ELOOP, ...
            return f"cannot {'create' if create else 'check'} it: {exc.strerror or exc}"
        if not stat.S_ISDIR(st.st_mode):
            return "it is not a directory"
        if st.st_uid != os.geteuid():
            return f"it is owned by uid {st.st_uid}, not by this user"
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            return "others may write to it"
        return None

    # -- reading and writing -------------------------------------------------------
    def get(self, name: str, key: str) -> bytes | None:
        """The verified payload, or None (missing, damaged, foreign, unreadable). Never raises."""
        if not self.usable():
            return None
        blob, _ = read_image_file(self.path_for(name, key))
        return None if blob is None else decode_image_file(key, blob)

    def put(self, name: str, key: str, payload: bytes) -> bool:
        """Publish atomically. False (after one warning) when the disk refuses."""
        if not self.usable():
            return False
        self._sweep_stale_temps()
        for attempt in (1, 2):
            try:
                self._publish(self.path_for(name, key), encode_image_file(key, payload))
                return True
            except FileNotFoundError:  # directory removed under us (or our temp swept): recreate, retry once
                self._usable = None
                if attempt == 2 or not self.usable():
                    self._warn("it disappeared while writing")
                    return False
            except OSError as exc:
                self._warn(exc.strerror or str(exc))  # EROFS, EACCES, ENOSPC, EDQUOT, ...
                return False
        return False

    def _publish(self, final: Path, blob: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=TMP_SUFFIX, dir=self.directory)  # 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())  # the bytes are on disk before the name points at them
            os.replace(tmp, final)
            tmp = None
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _sweep_stale_temps(self) -> None:
        """Once per process: remove temp files of writers that died (killed mid-write).
        A fresh temp file may belong to a live writer, so only old ones go."""
        if self._swept:
            return
        self._swept = True
        cutoff = time.time() - STALE_TMP_S
        try:
            with os.scandir(self.directory) as it:
                for e in it:
                    try:
                        if _is_temp_name(e.name) and e.is_file(follow_symlinks=False) \
                                and e.stat(follow_symlinks=False).st_mtime < cutoff:
                            os.unlink(e.path)
                    except OSError:
                        pass
        except OSError:
            pass

    def discard(self, name: str, key: str) -> None:
        """Remove an image file that decoded but would not load (so the next put replaces it)."""
        try:
            self.path_for(name, key).unlink()
        except OSError:
            pass

    @contextmanager
    def lock(self, name: str, key: str, timeout: float | None = None) -> Iterator[bool]:
        """Advisory cross-process lock for one image file; yields whether it was taken. Skipped
        (yields False) if the lock file cannot be opened or is held past ``timeout``."""
        timeout = LOCK_TIMEOUT_S if timeout is None else timeout
        fd = None
        if self.usable():
            try:
                fd = os.open(str(self.path_for(name, key)) + LOCK_SUFFIX,
                             os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                if not _flock_with_timeout(fd, timeout):
                    os.close(fd)
                    fd = None
            except OSError:
                if fd is not None:
                    os.close(fd)
                fd = None
        try:
            yield fd is not None
        finally:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    # -- maintenance (CLI) ---------------------------------------------------------
    def scan(self, verify: bool = True) -> Scan:
        """Sort the directory's names into image files, locks, temps and foreign names (a
        subdirectory is foreign whatever its name: the cache never makes one), reading and
        verifying each image file against the key in its name unless ``verify`` is False.
        Never raises and creates nothing: a directory that cannot be listed gives an empty
        scan with its ``error``."""
        kinds: dict[str | None, list[str]] = {IMAGE: [], LOCK: [], TEMP: [], None: []}
        try:
            with os.scandir(self.directory) as it:
                for e in it:
                    kind = name_kind(e.name)
                    try:
                        if kind is not None and e.is_dir(follow_symlinks=False):
                            kind = None
                    except OSError:
                        pass
                    kinds[kind].append(e.name)
        except OSError as exc:
            return Scan([], [], [], [], exc)
        images = [self._image_file(name, verify) for name in sorted(kinds[IMAGE])]
        return Scan(images, sorted(kinds[LOCK]), sorted(kinds[TEMP]), sorted(kinds[None]))

    def _image_file(self, fname: str, verify: bool) -> ImageFile:
        path = self.directory / fname
        module, arch, key = parse_image_name(fname)
        blob, problem = read_image_file(path) if verify else (None, None)
        if verify and problem is None:
            problem = image_file_problem(key, blob)
        try:
            size = len(blob) if blob is not None else os.lstat(path).st_size
        except OSError:
            size = 0
        return ImageFile(path, size, module, arch, key, problem)

    def _unlink_all(self, names: Iterable[str]) -> Removal:
        removed, failed = [], []
        for fname in names:
            try:
                os.unlink(self.directory / fname)  # a symlink goes, never its target
                removed.append(fname)
            except FileNotFoundError:
                pass  # gone meanwhile (another clear, or a put's temp renamed)
            except OSError as exc:
                failed.append((fname, exc.strerror or str(exc)))
        return Removal(removed, failed)

    def remove_images(self, names: Iterable[str]) -> Removal:
        """Remove these image files (by name) and their lock files; nothing else."""
        doomed = []
        for fname in names:
            if name_kind(fname) != IMAGE:
                raise ValueError(f"not an image file name of the cache: {fname!r}")
            doomed += [fname, fname + LOCK_SUFFIX]
        return self._unlink_all(doomed)  # a missing lock file is no failure: not every image has one

    def clear(self) -> Removal:
        """Remove every image file, lock file (orphans too) and temp file; nothing else (foreign
        names and subdirectories stay, so does the directory). A missing directory is
        nothing to remove; one that cannot be listed is one failure, named ``.``."""
        scan = self.scan(verify=False)
        if isinstance(scan.error, FileNotFoundError):
            return Removal([], [])
        if scan.error is not None:
            return Removal([], [(".", scan.error.strerror or str(scan.error))])
        return self._unlink_all([i.path.name for i in scan.images] + scan.locks + scan.temps)


def _flock_with_timeout(fd: int, timeout: float) -> bool:
    """flock(LOCK_EX), giving up after ``timeout`` seconds (polls, backing off to 50 ms)."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


_caches: dict[Path, DiskCache] = {}


_location_warned: set[str] = set()


def current() -> DiskCache | None:
    """The cache chosen by the environment right now, or None when disabled or when no
    directory can be determined (kernels then stay in memory, with one warning per cause)."""
    if not settings.disk_cache_enabled():
        return None
    try:
        d = settings.cache_dir()
    except CacheLocationError as exc:
        if str(exc) not in _location_warned:
            _location_warned.add(str(exc))
            log.warning("nvrtc_gather: not using a kernel cache: %s; kernels are kept in memory only. Set %s=1 to "
                        "silence this.", exc, settings.DISABLE_CACHE_ENV)
        return None
    c = _caches.get(d)
    if c is None:
        c = _caches.setdefault(d, DiskCache(d))
    return c
