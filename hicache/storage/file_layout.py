"""The file store's on-disk layout, and the only file-system calls it makes on it.

    <root>/                                    --hicache-storage-dir: the user's, not group/other-writable
    <root>/.hicache-usage                      the directory's total bytes, shared by processes (`file_ledger`)
    <root>/<32 hex>/                           a namespace directory (0700), ours when ...
    <root>/<32 hex>/namespace.json             ... this file (0600) describes a namespace whose digest
                                               starts with the directory's name (the marker)
    <root>/<ns>/<2 hex>/                       first two hex of the page hash (0700)
    <root>/<ns>/<2 hex>/<64 hex>.page          an object: header + payload (0600)
    <root>/<ns>/<2 hex>/.<64 hex>.page.<16 hex>.tmp   a write in progress (random name, O_EXCL),
                                               flock'ed by its writer, at its final size

Nothing else under the root is ours: the index, the stale-temporary sweep and eviction
touch only names this table produces, under namespace directories with a valid marker.
No call follows a symbolic link inside the store: temporaries are created with
``O_CREAT | O_EXCL | O_NOFOLLOW``, objects opened with ``O_NOFOLLOW | O_NONBLOCK`` and
accepted only if ``fstat`` says regular file (a FIFO never blocks a reader), directories
checked with ``lstat`` (a real directory owned by this user).
"""
from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from bounded_input import over_limit, parse_json
from hicache.storage.base import StorageUnavailableError
from hicache.storage.keys import describe_digest

NAMESPACE_FILE = "namespace.json"
OBJECT_SUFFIX = ".page"
TMP_SUFFIX = ".tmp"
DIR_MODE = 0o700
FILE_MODE = 0o600
MARKER_MAX_BYTES = 1 << 16  # a namespace.json is ~1 KiB; anything far larger is not ours
NS_DIR_RE = re.compile(r"[0-9a-f]{32}")
SUBDIR_RE = re.compile(r"[0-9a-f]{2}")
OBJECT_RE = re.compile(r"[0-9a-f]{64}\.page")
OBJECT_TMP_RE = re.compile(r"\.[0-9a-f]{64}\.page\.[0-9a-f]{16}\.tmp")  # an object's write in flight
# ours: ".<final name>.<16 random hex>.tmp"; older versions: ".<64 hex or namespace.json>.<pid>.<thread>.tmp"
TMP_RE = re.compile(r"\.(?:[0-9a-f]{64}\.page|namespace\.json)\.[0-9a-f]{16}\.tmp"
                    r"|\.(?:[0-9a-f]{64}|namespace\.json)\.\d+\.\d+\.tmp")
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotAFile(OSError):
    """Something other than a regular file (a link, a directory, a FIFO ...) at an object's name."""


def open_root(root: str | os.PathLike) -> Path:
    """The store's directory, created private (0700) if missing; its real path.

    Raises:
        StorageUnavailableError: it cannot be created, is not a directory, is not owned by
            this user, or others (group or world) may write to it; or one of its parent
            directories is owned by another user than root or this one, or others may write
            to it without the sticky bit (they could swap the whole directory): anyone who
            can do that can forge the pages this server serves (message names
            ``--hicache-storage-dir`` and the directory at fault).
    """
    path = Path(root).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        real = Path(os.path.realpath(path))
        why = _unsafe_parents(real)
        if not why:
            _make_private(real)
            why = _unsafe(os.stat(real))
    except OSError as e:
        raise StorageUnavailableError(f"file storage: cannot use --hicache-storage-dir {root}: "
                                      f"{e.strerror or e}") from e
    if why:
        raise StorageUnavailableError(f"file storage: refusing --hicache-storage-dir {real}: {why}; pages there "
                                      "could be forged or read by other users (see the README's trust model)")
    return real


def _make_private(path: Path) -> None:
    try:
        path.mkdir(DIR_MODE)
        os.chmod(path, DIR_MODE)  # exact, whatever the umask
    except FileExistsError:
        pass  # there already, or another process made it meanwhile: checked like any existing one


def _unsafe_parents(real: Path) -> str:
    """Why a parent of ``real`` lets someone else replace it (the rule ssh and sudo apply):
    each must be owned by root or this user, and not writable by group or others unless
    sticky (like /tmp: only an entry's owner may rename or remove it)."""
    for parent in reversed(real.parents):  # from / down: the outermost fault is named
        st = os.stat(parent)
        if st.st_uid not in (0, os.geteuid()):
            return (f"its parent directory {parent} is owned by uid {st.st_uid}, neither root nor this user "
                    f"(uid {os.geteuid()}), who could swap the whole directory")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return (f"its parent directory {parent} is writable by {_writers(st.st_mode)} without the sticky bit "
                    f"(mode {stat.S_IMODE(st.st_mode):o}), who could swap the whole directory; choose a directory "
                    "under parents only root and you can change")
    return ""


def _writers(mode: int) -> str:
    return {0o020: "its group", 0o002: "others", 0o022: "its group and others"}[mode & 0o022]


def _unsafe(st: os.stat_result) -> str:
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return (f"writable by {_writers(st.st_mode)} (mode {stat.S_IMODE(st.st_mode):o}; `chmod go-w` it or choose "
                "a private directory)")
    return ""


def private_dir(path: str) -> None:
    """Make ``path`` a directory of ours (0700), or check the one there (tightened to 0700).

    Raises:
        OSError: something else is there (a link, a file, another user's directory).
    """
    try:
        os.mkdir(path, DIR_MODE)
        os.chmod(path, DIR_MODE)
        return
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(errno.ENOTDIR, f"{path} is not a directory of this user's (a link or another file is "
                                     "in the store's place)")
    if stat.S_IMODE(st.st_mode) != DIR_MODE:  # made by an older version: 0755
        os.chmod(path, DIR_MODE)


def open_regular(path: str) -> int | None:
    """A read-only descriptor of the regular file at ``path``; ``None`` if nothing is there.

    Never blocks (a FIFO opens non-blocking and is refused) and never follows a link.

    Raises:
        NotAFile: a link, directory, FIFO, socket or device is there.
        OSError: any other failure.
    """
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise NotAFile(errno.ELOOP, "a symbolic link") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotAFile(errno.EINVAL, describe_mode(mode))
    return fd


def entry_mode(path: str) -> int | None:
    """``st_mode`` of what is at ``path`` itself (a link is not followed), ``None`` if nothing."""
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None


def is_regular(path: str) -> bool:
    """Whether a regular file (not a link to one) is at ``path``."""
    mode = entry_mode(path)
    return mode is not None and stat.S_ISREG(mode)


def describe_mode(mode: int) -> str:
    """What a non-regular ``st_mode`` is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device or other special file"


def clear_entry(path: str) -> None:
    """Remove what is at ``path`` (one of our names) so that it can be written again:
    a link, FIFO, socket or file is unlinked (never followed), an empty directory removed.

    Raises:
        OSError: a non-empty directory is there (not ours to delete; named in the message).
    """
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            os.rmdir(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise OSError(e.errno, f"a non-empty directory is at the object name {path}; it is not hicache's, "
                                   "remove it by hand") from None
        raise


def publish(directory: str, name: str, parts: list, fsync: bool = False) -> None:
    """Write ``parts`` (buffers) as the file ``directory/name``, all or nothing.

    The bytes go to a new private temporary (`new_temp`), then it is renamed over ``name``
    (a rename replaces a link itself, never its target). Readers see the whole file or none.

    Raises:
        OSError: the write or the rename failed (the temporary is removed).
    """
    tmp, fd = new_temp(directory, name)
    try:
        try:
            write_all(fd, parts, fsync)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        unlink_quiet(tmp)
        raise


def new_temp(directory: str, name: str) -> tuple[str, int]:
    """A new private temporary ``.<name>.<random>.tmp`` in ``directory`` and its descriptor,
    created with ``O_EXCL | O_NOFOLLOW``: a name planted there (a link to a victim file)
    fails the call instead of being followed.

    Raises:
        OSError: it cannot be created.
    """
    tmp = os.path.join(directory, f".{name}.{os.urandom(8).hex()}{TMP_SUFFIX}")
    return tmp, os.open(tmp, _CREATE_FLAGS, FILE_MODE)


def write_all(fd: int, parts: list, fsync: bool = False) -> None:
    """Write every byte of ``parts`` (buffers) at the file's offset (short writes resumed);
    ``fsync`` the file after them if asked."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        views = advance(views, os.writev(fd, views))
    if fsync:
        os.fsync(fd)


def unlink_quiet(path: str) -> bool:
    """Remove ``path`` (never following a link); ``False`` if it was already gone."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def advance(views: list[memoryview], nbytes: int) -> list[memoryview]:
    """What is left of ``views`` after the first ``nbytes`` went through."""
    while views and nbytes >= len(views[0]):
        nbytes -= len(views[0])
        views = views[1:]
    if views and nbytes:
        views = [views[0][nbytes:], *views[1:]]
    return views


def read_marker(ns_dir: str) -> dict | str | None:
    """The namespace a directory's ``namespace.json`` describes; ``None`` if there is none;
    else why it cannot be used (a string naming the file: not a regular file, over
    `MARKER_MAX_BYTES`, not UTF-8, not JSON within `bounded_input.parse_json`'s depth and
    digit bounds, not an object, or not matching the directory's name). Never raises for
    what the file holds: a damaged marker is a miss, whatever the damage."""
    path = os.path.join(ns_dir, NAMESPACE_FILE)
    try:
        fd = open_regular(path)
        if fd is None:
            return None
        try:
            raw = os.read(fd, MARKER_MAX_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as e:
        return f"{path} is {e.strerror}" if isinstance(e, NotAFile) else f"{path}: {e.strerror or e}"
    if len(raw) > MARKER_MAX_BYTES:
        return str(over_limit(path, raw, MARKER_MAX_BYTES, "a namespace marker"))
    try:
        doc = parse_json(raw, path)
    except ValueError as e:  # names the file and the line
        return str(e)
    if not isinstance(doc, dict) or describe_digest(doc).hex()[:32] != os.path.basename(ns_dir):
        return f"{path} describes another namespace than its directory's name"  # a wrong type included
    return doc


def scan_root(root: str | os.PathLike) -> tuple[list[str], list[tuple[str, str]]]:
    """The namespace directories of ours under ``root`` (a name, a real directory, a valid
    marker), and (directory, why) for each one with a namespace's name whose marker is
    damaged (`read_marker`: a miss, never an error). A directory without a marker yet
    (another process creating it) is in neither list."""
    ours, damaged = [], []
    with os.scandir(root) as entries:
        for entry in entries:
            if NS_DIR_RE.fullmatch(entry.name) is None or not entry.is_dir(follow_symlinks=False):
                continue
            found = read_marker(entry.path)
            if isinstance(found, dict):
                ours.append(entry.path)
            elif found is not None:
                damaged.append((entry.path, found))
    return ours, damaged
