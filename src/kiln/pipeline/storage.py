"""One storage layer for local paths and object stores (gs://, any Beam filesystem).

Everything the launcher does to files outside the Beam job goes through here:
listing, reading and writing small files atomically, creating a file only if
it does not exist (the build lock), moving a finished folder into place and
deleting trees. Each operation is written once per kind of store, behind
`store_for`, so callers never branch on the scheme:

- `LocalStore`: POSIX semantics. A folder rename is atomic, small files are
  written to a hidden temp name and renamed, exclusive creation is
  ``O_CREAT | O_EXCL``.
- `ObjectStore`: Cloud Storage semantics through Beam's `FileSystems`. There
  are no folders (a folder is a name prefix), an object appears whole when
  its writer closes, and rename is copy-then-delete, so a folder is moved file
  by file with a chosen file last. Exclusive creation uses the store's
  precondition (GCS ``ifGenerationMatch=0``, S3 ``If-None-Match: *``) where
  the store has one. Files are written through `create`, which also writes
  an empty object on S3.
"""

from __future__ import annotations

import abc
import errno
import io
import itertools
import logging
import os
import queue
import re
import secrets
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, NamedTuple, cast

from kiln.lazy_import import LazyModule

if TYPE_CHECKING:
    from apache_beam.io.filesystem import FileMetadata
    from apache_beam.io.filesystems import FileSystems
else:
    # Beam is imported by the first operation on an object store (or the
    # first local listing, which yields Beam's FileMetadata): validating a
    # config, which only joins and checks local paths, does not need it.
    FileSystems = LazyModule("apache_beam.io.filesystems", "FileSystems")

logger = logging.getLogger(__name__)

TEMP_MARK = ".tmp-"  # hidden temp names of small writes: ``.<name>.tmp-<random>``

# What Beam's FileSystems.get_scheme recognizes as a URI's scheme.
_SCHEME = re.compile(r"(?P<scheme>[a-zA-Z][-a-zA-Z0-9+.]*)://.*")


class UnlistableFolder(OSError):
    """A folder below a listed one that cannot be listed (permission
    denied, an I/O error, gone since its parent was listed): its files
    would be missing from the listing without a word (a whole class of an
    image folder), so the listing stops instead."""


def _unlistable(error: OSError) -> None:
    """`os.walk`'s ``onerror``: a folder it cannot list stops the walk,
    except a file system's own ``lost+found`` (`is_lost_and_found`)."""
    if is_lost_and_found(error.filename):
        logger.debug("not listed: %s (%s)", error.filename, error.strerror)
        return
    raise UnlistableFolder(
        error.errno, f"cannot list folder {error.filename}: {error.strerror}", error.filename
    ) from error


def is_lost_and_found(path: str | None) -> bool:
    """Whether `path` is the ``lost+found`` folder at the top of a file
    system (fsck's, readable by root only): a source folder that is a mount
    point has one, and no image in it."""
    if not path or os.path.basename(path) != "lost+found":
        return False
    return os.path.ismount(os.path.dirname(os.path.abspath(path)))


class FileStatus(NamedTuple):
    """What one status request says of a listed file.

    Attributes:
      size: Its size in bytes.
      mtime: Its modification time (seconds; an object's update time).
      problem: Why it cannot be read as a plain file (a folder, a named
        pipe, a device), or None if it can.
      inode_ctime: A local file's status-change identity (`inode_ctime`),
        None for an object (its update time changes on every write).
    """

    size: int
    mtime: float
    problem: str | None
    inode_ctime: str | None = None


def inode_ctime(status: os.stat_result) -> str:
    """A local file's status-change identity: ``"<inode>:<ctime in ns>"``,
    compared for equality only, as git's index keeps them beside a file's
    size and modification time.

    Whatever keeps a file's size and modification time while changing its
    bytes changes this: a new file (``cp -p``, ``tar x``, ``rsync -a``
    write one, or a rename puts another in its place) has another inode,
    and writing to a file, renaming it, setting its times (``touch -r``,
    `os.utime`) or its mode set its ctime to the time of the change, which
    no call can set back."""
    return f"{status.st_ino}:{status.st_ctime_ns}"


# The build's pipeline flags, until they are handed to Beam's FileSystems (`use_pipeline_options`).
_pending_options: list[str] | None = None


def use_pipeline_options(pipeline_args: Sequence[str]) -> None:
    """Configures Beam's filesystems in this process with the build's pipeline flags.

    Beam's S3 filesystem takes its endpoint, region and credentials only
    from pipeline options (``--s3_endpoint_url``, ``--s3_access_key_id``,
    ...): its workers get them with the job, and a process outside a job only
    through ``FileSystems.set_options``. The launcher's own file access (the
    config check, the listing, the lock, publishing, LATEST) thus uses the
    same flags as the workers. If Beam is not imported yet, the flags are
    handed over at the first access to an object store: a local config is
    still checked without importing Beam.
    """
    global _pending_options
    _pending_options = list(pipeline_args)
    if "apache_beam.io.filesystems" in sys.modules:
        _apply_pipeline_options()


def _apply_pipeline_options() -> None:
    global _pending_options
    if _pending_options is None:
        return
    from apache_beam.options.pipeline_options import PipelineOptions

    FileSystems.set_options(PipelineOptions(_pending_options))
    _pending_options = None


def is_remote(path: str) -> bool:
    """True for URIs with a scheme (gs://...), False for local paths."""
    match = _SCHEME.match(path.strip())
    return match is not None and match.group("scheme") != "file"


def create(path: str, **kwargs: Any) -> BinaryIO:
    """A file open for writing at `path`: Beam's ``FileSystems.create(path, **kwargs)``,
    which every file kiln writes goes through, except that an empty object
    is written whole in one request.

    Beam's S3 filesystem writes every object as a multipart upload, and an
    empty one as an upload of no parts, which S3 refuses ("You must specify
    at least one part"; moto: MalformedXML). kiln writes empty files (an
    errors.jsonl or duplicates.jsonl with no rows). So on s3:// the upload
    starts at the first byte written, and a file closed with none is one
    plain PUT instead.
    """
    if not path.startswith("s3://") or _compressed(path, kwargs):
        return FileSystems.create(path, **kwargs)
    return cast("BinaryIO", _S3Writer(path, kwargs))


def _compressed(path: str, kwargs: dict[str, Any]) -> bool:
    """Whether Beam would compress what is written to `path` (an empty
    compressed file is not empty)."""
    from apache_beam.io.filesystem import CompressionTypes

    kind = kwargs.get("compression_type", CompressionTypes.AUTO)
    if kind == CompressionTypes.AUTO:
        kind = CompressionTypes.detect_compression_type(path)
    return kind != CompressionTypes.UNCOMPRESSED


class _S3Writer(io.RawIOBase):
    """Beam's S3 writer, opened at the first byte written (`create`)."""

    def __init__(self, path: str, kwargs: dict[str, Any]):
        super().__init__()
        self._path = path
        self._kwargs = kwargs
        self._file: BinaryIO | None = None
        self._written = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # bytes-like, as BufferedWriter's
        size = memoryview(data).nbytes
        if size:
            if self._file is None:
                self._file = FileSystems.create(self._path, **self._kwargs)
            self._file.write(data)
            self._written += size
        return size

    def tell(self) -> int:
        return self._written

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._file is not None:
                self._file.close()
            else:
                _s3_put(self._path, b"")
        finally:
            super().close()


# The pipeline options Beam's S3 client is made from (`S3Options`), in the
# order of `_s3_client`'s key.
_S3_SETTINGS = (
    "s3_access_key_id",
    "s3_secret_access_key",
    "s3_session_token",
    "s3_endpoint_url",
    "s3_region_name",
    "s3_api_version",
    "s3_disable_ssl",
    "s3_verify",
)
# Connections one client keeps open to the store: a job's threads share it
# (botocore's default, 10, would drop and reopen connections beyond that).
_S3_POOL_CONNECTIONS = 64
_s3_clients: dict[tuple[Any, ...], Any] = {}
_s3_clients_lock = threading.Lock()


def _s3_client(path: str):
    """A boto3 client for `path`, made as Beam's S3 filesystem makes its own
    (`apache_beam.io.aws.clients.s3.boto3_client`) from the same pipeline
    options (``--s3_endpoint_url``, credentials...), once per process and
    settings and shared by its threads (boto3's clients are thread-safe).

    Beam's filesystem makes a boto3 session and client for every file it
    opens (botocore loads its service model each time: tenths of a second
    of CPU), which was most of an s3:// build's time with small images.
    """
    from apache_beam.options.pipeline_options import PipelineOptions, S3Options
    from apache_beam.options.value_provider import RuntimeValueProvider

    # The options FileSystems.get_filesystem gives the S3 filesystem it makes
    # (set by the launcher or Beam's worker).
    options: Any = FileSystems._pipeline_options or RuntimeValueProvider.runtime_options
    if isinstance(options, PipelineOptions):
        view = options.view_as(S3Options)
        settings = tuple(getattr(view, name) for name in _S3_SETTINGS)
    elif isinstance(options, dict):
        settings = tuple(options.get(name) for name in _S3_SETTINGS)
    else:
        raise ValueError(f"{path}: no pipeline options to configure S3 with")
    with _s3_clients_lock:
        client = _s3_clients.get(settings)
        if client is None:
            client = _new_s3_client(dict(zip(_S3_SETTINGS, settings, strict=True)))
            _s3_clients[settings] = client
        return client


def _new_s3_client(settings: dict[str, Any]):
    from botocore.config import Config
    from botocore.session import get_session  # boto3's sessions are botocore's

    return get_session().create_client(
        "s3",
        region_name=settings["s3_region_name"],
        api_version=settings["s3_api_version"],
        use_ssl=not settings["s3_disable_ssl"],
        verify=settings["s3_verify"],
        endpoint_url=settings["s3_endpoint_url"],
        aws_access_key_id=settings["s3_access_key_id"],
        aws_secret_access_key=settings["s3_secret_access_key"],
        aws_session_token=settings["s3_session_token"],
        config=Config(max_pool_connections=_S3_POOL_CONNECTIONS),
    )


def _s3_open(path: str) -> BinaryIO:
    """An S3 object open for reading its bytes: one GET through the
    process's client (`_s3_client`), where Beam's filesystem makes a client
    and sends a HEAD before its GET.

    Raises:
      FileNotFoundError: there is no such object.
      botocore's errors: any other (access denied, no such bucket, the store
        cannot be reached), which `unreachable_reason` recognizes.
    """
    from apache_beam.io.aws import s3io
    from botocore.exceptions import ClientError

    bucket, key = s3io.parse_s3_path(path)
    try:
        response = _s3_client(path).get_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            raise FileNotFoundError(errno.ENOENT, "no such object", path) from e
        raise
    return cast(BinaryIO, response["Body"])


def _s3_exists(path: str) -> bool:
    """Whether an S3 object exists: one HEAD through the process's client."""
    from apache_beam.io.aws import s3io
    from botocore.exceptions import ClientError

    bucket, key = s3io.parse_s3_path(path)
    try:
        _s3_client(path).head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return False
        raise
    return True


def _s3_put(path: str, data: bytes, **conditions: str) -> None:
    """One PUT of a whole object (boto3 ``put_object``), with `conditions`
    such as ``IfNoneMatch="*"``."""
    from apache_beam.io.aws import s3io

    bucket, key = s3io.parse_s3_path(path)
    _s3_client(path).put_object(Bucket=bucket, Key=key, Body=data, **conditions)


def _s3_create_exclusive(path: str, data: bytes) -> bool:
    """Creates an S3 object only if none exists (``If-None-Match: *``)."""
    from botocore.exceptions import ClientError

    try:
        _s3_put(path, data, IfNoneMatch="*")
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") == "PreconditionFailed":
            return False
        raise
    return True


def _s3_replace_if_unchanged(path: str, expected: bytes, data: bytes) -> bool:
    """`Store.replace_if_unchanged` on S3: the object read with its ETag,
    written with ``If-Match`` of that ETag."""
    from apache_beam.io.aws import s3io
    from botocore.exceptions import ClientError

    bucket, key = s3io.parse_s3_path(path)
    try:
        current = _s3_client(path).get_object(Bucket=bucket, Key=key)
        if current["Body"].read() != expected:
            return False
        _s3_put(path, data, IfMatch=current["ETag"])
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code")
        if code in ("PreconditionFailed", "NoSuchKey", "ConditionalRequestConflict"):
            return False
        raise
    return True


def join(base: str, *parts: str) -> str:
    if not is_remote(base):
        return os.path.join(base, *parts)  # what Beam's LocalFileSystem.join does
    return FileSystems.join(base, *parts)


def absolute(path: str) -> str:
    """A local path made absolute (``~`` expanded); a URI without its trailing '/'."""
    if is_remote(path):
        return path.rstrip("/")
    return os.path.abspath(os.path.expanduser(path))


def inside(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies below it (by name)."""
    path, folder = path.rstrip("/") + "/", folder.rstrip("/") + "/"
    return path.startswith(folder)


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


class Store(abc.ABC):
    """The operations kiln needs from a store. Paths are full paths or URIs."""

    has_special_files: ClassVar[bool] = True
    """Whether a listed path can be other than a plain file (a folder, a named
    pipe, a device, a dangling link), so that `file_status` can refuse it."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a file (or, locally, a folder) exists at `path`."""

    def existing(self, paths: Sequence[str]) -> set[str]:
        """Those of `paths` that exist (`exists` of each)."""
        return {path for path in paths if self.exists(path)}

    @abc.abstractmethod
    def has_files(self, folder: str) -> bool:
        """Whether anything is stored below `folder`.

        Raises:
          UnlistableFolder: a local folder below it cannot be listed.
        """

    def list_tree(self, folder: str, *, skip_hidden: bool = False) -> list[FileMetadata]:
        """Every file below `folder`, recursively, sorted by path (see `walk_tree`)."""
        return sorted(self.walk_tree(folder, skip_hidden=skip_hidden), key=lambda m: m.path)

    @abc.abstractmethod
    def walk_tree(
        self, folder: str, *, skip_hidden: bool = False, links_above: int | None = None
    ) -> Iterator[FileMetadata]:
        """Every file below `folder`, recursively, in no particular order.

        With `skip_hidden`, files and folders whose name starts with '.' are
        left out (and, where the store has folders, not entered). A file that
        cannot be stat'ed (a dangling link), or a link to a folder above it,
        which is not entered, is listed with size 0.

        With `links_above` (stores with symbolic links), a folder
        `links_above` or more levels below `folder` is entered only if it
        is where its path says, reached through no symbolic link; else it
        is listed itself, with size 0, for the caller to report. Links are
        then followed only at the first levels (an image folder's class and
        split folders): one deeper can lead anywhere, ``/`` included, or
        make a tree of links whose paths double at every level.

        Raises:
          UnlistableFolder: a local folder below `folder` (or `folder`
            itself) cannot be listed: permission denied, an I/O error, or
            gone since its parent was listed. Its files are not skipped
            without a word.
        """

    @abc.abstractmethod
    def file_status(self, path: str) -> FileStatus:
        """Size, modification time, why `path` cannot be read as a plain
        file (a folder, a named pipe, a device) or None if it can, and a
        local file's `inode_ctime`.

        Raises:
          OSError, BeamIOError: the path does not exist.
        """

    @abc.abstractmethod
    def children(self, folder: str) -> list[str]:
        """Names of the entries directly in `folder` (files and folders), sorted."""

    @abc.abstractmethod
    def write_atomic(self, path: str, data: bytes) -> None:
        """Replaces `path` with `data` so that readers see the old or the new whole."""

    @abc.abstractmethod
    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Creates `path` with `data` only if it does not exist; False if it did."""

    def replace_if_unchanged(self, path: str, expected: bytes, data: bytes) -> bool:
        """Replaces `path` with `data` only if it still holds `expected`
        (compare and swap); False if it changed or is gone.

        Atomic on Cloud Storage (``ifGenerationMatch`` of the generation
        read) and S3 (``If-Match`` of the ETag read). Elsewhere a check,
        then a write: two writers can both pass the check in the same
        instant, and the lock's read-back (`lock.DatasetLock`) notices.
        """
        if self.read_bytes(path) != expected:
            return False
        self.write_atomic(path, data)
        return True

    @abc.abstractmethod
    def delete_tree(self, folder: str) -> None:
        """Deletes a folder and everything below it, if it exists."""

    @abc.abstractmethod
    def move_tree(self, source: str, target: str, last: str) -> None:
        """Moves the folder `source` to `target` (which must not exist), the
        file named `last` (directly in `source`) made visible last."""

    @abc.abstractmethod
    def sync_tree(self, folder: str) -> None:
        """Makes what is below `folder` durable: on disk, not only in the
        page cache, so that a power loss after a later step (LATEST naming
        the folder) cannot leave that step without the files it names.
        Locally: an fsync of every file and folder, one pass. Object
        stores: nothing, a write that returned is durable."""

    @abc.abstractmethod
    def sync_folder(self, folder: str) -> None:
        """Makes the entries of `folder` durable: what was renamed into it
        or created in it (`sync_tree` of the folder alone). Object stores:
        nothing."""

    @abc.abstractmethod
    def move_files(self, paths: Sequence[str], folder: str) -> None:
        """Moves the files `paths` into `folder` (created if missing), each
        under its own name."""

    @abc.abstractmethod
    def clean_temp_files(self, folder: str) -> list[str]:
        """Deletes the temp files unfinished `write_atomic` calls left directly
        in `folder`; returns their paths."""

    def read_bytes(self, path: str) -> bytes | None:
        """A file's bytes, or None if it does not exist."""
        try:
            with FileSystems.open(path) as f:
                return f.read()
        except FileNotFoundError:
            return None
        except Exception:  # Beam wraps a missing object in BeamIOError on some stores
            if not self.exists(path):
                return None
            raise

    def read_text(self, path: str) -> str | None:
        """A small file's text, or None if it does not exist."""
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8")

    def modified_time(self, path: str) -> float:
        return FileSystems.get_filesystem(path).metadata(path).last_updated_in_seconds

    def delete(self, paths: Iterable[str]) -> None:
        """Deletes files that exist; missing ones are not an error."""
        present = [path for path in paths if self.exists(path)]
        if present:
            FileSystems.delete(present)


def _fsync(path: str, flags: int) -> None:
    """fsync of the file or folder `path`. A filesystem that cannot fsync a
    folder (EINVAL: some network and FUSE filesystems) is left to its own
    guarantees."""
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP) or not os.path.isdir(path):
            raise
    finally:
        os.close(fd)


class LocalStore(Store):
    """A local (or mounted) filesystem."""

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def has_files(self, folder: str) -> bool:
        if not os.path.isdir(folder):
            return False
        return any(files for _, _, files in os.walk(folder, onerror=_unlistable))

    def walk_tree(
        self, folder: str, *, skip_hidden: bool = False, links_above: int | None = None
    ) -> Iterator[FileMetadata]:
        from apache_beam.io.filesystem import FileMetadata

        # Symbolic links to folders are followed (a linked class folder is
        # listed, not skipped without a word), except a link back to one of
        # its own ancestors, which would loop, and (with `links_above`) a
        # linked folder deeper than that: it is listed itself, with size 0
        # as a dangling link is, for the caller to report (as a folder,
        # `file_status`, or by where it is), rather than vanish. Callers
        # decide what a link that leads elsewhere may read (`sources`
        # confines inputs).
        top = os.path.abspath(folder)
        real_top = os.path.realpath(top)
        for directory, folders, names in os.walk(top, followlinks=True, onerror=_unlistable):
            if _loops(directory, top):
                folders[:] = []
                yield FileMetadata(directory, 0, 0.0)
                continue
            folders[:] = sorted(f for f in folders if not (skip_hidden and f.startswith(".")))
            relative = os.path.relpath(directory, top)
            depth = 0 if relative == "." else relative.count(os.sep) + 1
            if links_above is not None and depth + 1 >= links_above:
                # One realpath per folder at these levels, none per file.
                linked = [
                    f
                    for f in folders
                    if os.path.realpath(os.path.join(directory, f))
                    != os.path.normpath(os.path.join(real_top, relative, f))
                ]
                for name in linked:
                    yield FileMetadata(os.path.join(directory, name), 0, 0.0)
                folders[:] = [f for f in folders if f not in linked]
            for name in sorted(names):
                if skip_hidden and name.startswith("."):
                    continue
                path = os.path.join(directory, name)
                try:
                    status = os.stat(path)
                except OSError:  # a dangling link: listed, size 0, for the caller to judge
                    yield FileMetadata(path, 0, 0.0)
                    continue
                yield FileMetadata(path, status.st_size, status.st_mtime)

    def file_status(self, path: str) -> FileStatus:
        # One os.stat: a manifest of a million local files lists in seconds.
        return local_file_status(path, os.stat(path))

    def children(self, folder: str) -> list[str]:
        try:
            return sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def write_atomic(self, path: str, data: bytes) -> None:
        folder, name = os.path.split(path)
        if folder:  # a bare file name is in the current folder
            os.makedirs(folder, exist_ok=True)
        temp = os.path.join(folder, f".{name}{TEMP_MARK}{secrets.token_hex(4)}")  # hidden
        try:
            with open(temp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, path)
        except BaseException:
            if os.path.lexists(temp):
                os.remove(temp)
            raise

    def create_exclusive(self, path: str, data: bytes) -> bool:
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True

    def delete_tree(self, folder: str) -> None:
        if os.path.lexists(folder):
            FileSystems.delete([folder])

    def move_tree(self, source: str, target: str, last: str) -> None:
        # One rename: the whole folder appears at once, `last` included.
        os.rename(source, target)

    def sync_tree(self, folder: str) -> None:
        for directory, _, names in os.walk(folder):
            for name in names:
                _fsync(os.path.join(directory, name), os.O_RDONLY)
            self.sync_folder(directory)

    def sync_folder(self, folder: str) -> None:
        _fsync(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))

    def move_files(self, paths: Sequence[str], folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        for path in paths:
            os.replace(path, os.path.join(folder, os.path.basename(path)))

    def clean_temp_files(self, folder: str) -> list[str]:
        removed = []
        for name in self.children(folder):
            if name.startswith(".") and TEMP_MARK in name:
                path = os.path.join(folder, name)
                try:
                    os.remove(path)
                except FileNotFoundError:  # another process cleaned it first
                    continue
                removed.append(path)
        return removed


class ObjectStore(Store):
    """An object store behind Beam's `FileSystems` (gs://, s3://, ...)."""

    has_special_files: ClassVar[bool] = False  # objects only: a listed one is readable

    def exists(self, path: str) -> bool:
        if path.startswith("s3://"):
            return _s3_exists(path)
        return FileSystems.exists(path)

    def has_files(self, folder: str) -> bool:
        # A prefix listing, not `FileSystems.match`: see `list_prefix`.
        return next(iter(list_prefix(folder.rstrip("/") + "/")), None) is not None

    def walk_tree(
        self, folder: str, *, skip_hidden: bool = False, links_above: int | None = None
    ) -> Iterator[FileMetadata]:
        root = folder.rstrip("/")  # objects have no links: `links_above` changes nothing
        if root.startswith("gs://"):
            # The first level by one delimiter listing, then every folder
            # there listed concurrently (`walk_prefixes`).
            top, folders = _gcs_first_level(root + "/")
            if skip_hidden:
                folders = [f for f in folders if not basename(f).startswith(".")]
            listed: Iterable[FileMetadata] = itertools.chain(top, walk_prefixes(folders))
        else:
            # Beam's match returns the whole listing at once (one metadata object per file).
            listed = list_prefix(root + "/")
        for metadata in listed:
            if not (
                skip_hidden
                and any(part.startswith(".") for part in metadata.path[len(root) + 1 :].split("/"))
            ):
                yield metadata

    def file_status(self, path: str) -> FileStatus:
        # Object stores hold plain objects only: nothing to refuse.
        metadata = FileSystems.get_filesystem(path).metadata(path)
        return FileStatus(
            int(metadata.size_in_bytes), float(metadata.last_updated_in_seconds), None
        )

    def existing(self, paths: Sequence[str]) -> set[str]:
        # One metadata request per object, concurrently (`walk_prefixes`).
        wanted = set(paths)
        return {m.path for m in walk_prefixes((), objects=sorted(wanted)) if m.path in wanted}

    def children(self, folder: str) -> list[str]:
        root = folder.rstrip("/")
        # One delimiter listing where the store has one, whatever lies deeper.
        level = folder_level(root + "/")
        if level is None:
            paths = [m.path for m in self.list_tree(root)]
        else:
            objects, folders = level
            paths = objects + folders
        return sorted({name for path in paths if (name := path[len(root) + 1 :].split("/", 1)[0])})

    def write_atomic(self, path: str, data: bytes) -> None:
        if path.startswith("s3://"):
            _s3_put(path, data)  # one PUT (Beam's writer: a multipart upload)
            return
        with create(path) as f:  # one object write: visible whole, on close
            f.write(data)

    def read_bytes(self, path: str) -> bytes | None:
        if path.startswith("s3://"):  # one GET (Beam's reader: a HEAD first)
            try:
                with _s3_open(path) as f:
                    return f.read()
            except FileNotFoundError:
                return None
        return super().read_bytes(path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        if path.startswith("gs://"):
            return _gcs_create_exclusive(path, data)
        if path.startswith("s3://"):
            return _s3_create_exclusive(path, data)
        # A store without preconditions: check, then write. Two builders can
        # both pass the check in the same instant; the lock's read-back
        # (`lock.DatasetLock`) notices when the other one won.
        if self.exists(path):
            return False
        self.write_atomic(path, data)
        return True

    def replace_if_unchanged(self, path: str, expected: bytes, data: bytes) -> bool:
        if path.startswith("gs://"):
            return _gcs_replace_if_unchanged(path, expected, data)
        if path.startswith("s3://"):
            return _s3_replace_if_unchanged(path, expected, data)
        return super().replace_if_unchanged(path, expected, data)

    def delete_tree(self, folder: str) -> None:
        files = [m.path for m in self.list_tree(folder)]
        if files:
            FileSystems.delete(files)

    def sync_tree(self, folder: str) -> None:
        pass  # an object's write that returned is durable

    def sync_folder(self, folder: str) -> None:
        pass  # no folders: an object's name is durable with it

    def move_tree(self, source: str, target: str, last: str) -> None:
        root, target = source.rstrip("/"), target.rstrip("/")
        files = [m.path for m in self.list_tree(root)]
        final = [path for path in files if path == f"{root}/{last}"]
        for group in ([path for path in files if path not in final], final):
            if group:
                FileSystems.rename(group, [target + path[len(root) :] for path in group])

    def move_files(self, paths: Sequence[str], folder: str) -> None:
        if paths:
            root = folder.rstrip("/")
            FileSystems.rename(list(paths), [f"{root}/{basename(path)}" for path in paths])

    def clean_temp_files(self, folder: str) -> list[str]:
        return []  # object writes leave no temp names


# Prefixes listed at once (`walk_prefixes`): the launcher's
# listing waits on the network, not on its CPU, while pages are in flight.
_PREFIX_THREADS = 8
# Objects per item handed from a listing thread to the caller.
_CHUNK = 1000


def walk_prefixes(prefixes: Iterable[str], objects: Iterable[str] = ()) -> Iterator[FileMetadata]:
    """Every object whose name starts with one of `prefixes`, and each of
    `objects` that exists (object store URIs), in no particular order.

    The prefixes are listed concurrently (`_PREFIX_THREADS` at a time:
    each prefix's pages come one after another, since each page's token
    names the next, but different prefixes need not wait for each other;
    the clients release the GIL while they wait) and streamed: a few pages
    are held in memory, whatever the listing's size. A prefix is listed as
    is, not as a glob pattern (Beam's `FileSystems.match` reads ``*``, ``?``
    and ``[`` in it as wildcards). An object under two of the prefixes
    comes twice. Each of `objects` is then one metadata request on the same
    threads (after the prefixes: a listing of many pages is the longest
    task, so it starts first); one that does not exist is left out.

    Raises:
      BeamIOError: a listing or a metadata request failed, other than for a
        missing object (the other requests are stopped).
    """
    _apply_pipeline_options()
    tasks = itertools.chain(
        ((list_prefix, prefix) for prefix in prefixes),
        ((_object_metadata, uri) for uri in objects),
    )
    return _walk_concurrently(tasks, lambda task: task[0](task[1]))


def _object_metadata(uri: str) -> Iterator[FileMetadata]:
    """The object `uri` by one metadata request: one item, or none if it does not exist."""
    try:
        metadata = FileSystems.get_filesystem(uri).metadata(uri)
    except Exception as e:  # Beam's BeamIOError, naming each path's error
        details = getattr(e, "exception_details", None) or {}
        if not (details and all(_is_not_found(problem) for problem in details.values())):
            raise
        return
    yield metadata


def _is_not_found(problem: object) -> bool:
    """Whether a store's error says the object does not exist: Python's
    FileNotFoundError, or HTTP 404 (google-cloud-storage's NotFound, Beam's
    S3 client errors carry a ``code``)."""
    return isinstance(problem, FileNotFoundError) or getattr(problem, "code", None) == 404


def list_prefix(prefix: str) -> Iterator[FileMetadata]:
    """The objects under `prefix`, page by page as the store returns them.

    Beam's filesystems list a prefix with ``_list``, a generator over the
    store's pages (what `FileSystems.match` collects into one list before
    it filters it with the glob's pattern). The prefix is taken as it is:
    `FileSystems.match` reads ``*``, ``?`` and ``[`` as wildcards and has
    no escape, so a folder named ``scans[2024]`` was not found through it.
    """
    return FileSystems.get_filesystem(prefix)._list(prefix)


def _walk_concurrently(tasks: Iterable[Any], walk: Callable[[Any], Iterator[Any]]) -> Iterator[Any]:
    """What `walk` yields for each of `tasks`, walked on `_PREFIX_THREADS`
    threads through a bounded queue, in no particular order."""
    pending = iter(tasks)
    take = threading.Lock()
    stop = threading.Event()
    chunks: queue.Queue[list[Any] | BaseException | None] = queue.Queue(2 * _PREFIX_THREADS)

    def hand_over(item: list[Any] | BaseException | None) -> bool:
        while not stop.is_set():
            try:
                chunks.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            while not stop.is_set():
                with take:
                    task = next(pending, None)
                if task is None:
                    break
                chunk: list[Any] = []
                for item in walk(task):
                    chunk.append(item)
                    if len(chunk) == _CHUNK:
                        if not hand_over(chunk):
                            return
                        chunk = []
                if chunk and not hand_over(chunk):
                    return
        except BaseException as e:  # handed to the caller, which raises it
            hand_over(e)
            return
        hand_over(None)

    threads = [
        threading.Thread(target=work, name=f"kiln-list-{i}", daemon=True)
        for i in range(_PREFIX_THREADS)
    ]
    for thread in threads:
        thread.start()
    try:
        running = len(threads)
        while running:
            item = chunks.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield from item
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def folder_level(prefix: str) -> tuple[list[str], list[str]] | None:
    """The objects directly under an object store `prefix` (ending in '/')
    and the prefixes of the folders there (ending in '/'), both sorted: one
    delimiter listing, a request per 1,000 entries, whatever lies deeper.
    None for a store that has no such listing.

    Beam's filesystems have none: kiln asks Cloud Storage (gs://) and S3
    (s3://) through their clients, and any other Beam filesystem that
    defines ``list_folder_level(prefix)`` with this contract (the tests'
    in-memory store does).
    """
    _apply_pipeline_options()
    if prefix.startswith("gs://"):
        objects, folders = _gcs_first_level(prefix)
        return [metadata.path for metadata in objects], folders
    if prefix.startswith("s3://"):
        return _s3_first_level(prefix)
    lister = getattr(FileSystems.get_filesystem(prefix), "list_folder_level", None)
    if lister is None:
        return None
    objects, folders = lister(prefix)
    return sorted(objects), sorted(folders)


def _s3_first_level(prefix: str) -> tuple[list[str], list[str]]:
    """`folder_level` on S3: ``ListObjectsV2`` with the delimiter '/'."""
    from apache_beam.io.aws import s3io

    bucket, name = s3io.parse_s3_path(prefix, object_optional=True)
    pages = (
        _s3_client(prefix)
        .get_paginator("list_objects_v2")
        .paginate(Bucket=bucket, Prefix=name, Delimiter="/")
    )
    objects: list[str] = []
    folders: list[str] = []
    for page in pages:
        objects += [f"s3://{bucket}/{item['Key']}" for item in page.get("Contents", ())]
        folders += [f"s3://{bucket}/{item['Prefix']}" for item in page.get("CommonPrefixes", ())]
    return sorted(objects), sorted(folders)


def _gcs_first_level(prefix: str) -> tuple[list[FileMetadata], list[str]]:
    """The objects directly under a gs:// `prefix` (ending in '/'), and the
    prefixes of its folders (ending in '/'), sorted: one listing with the
    delimiter '/', a request per 1,000 entries."""
    from apache_beam.io.filesystem import FileMetadata
    from apache_beam.io.gcp import gcsio
    from google.cloud import storage as gcs

    bucket_name, _, name = prefix[len("gs://") :].partition("/")
    pages = gcs.Client().list_blobs(bucket_name, prefix=name, delimiter="/")
    top = [
        # The time as Beam's listing gives it (`gcsio.GcsIO.list_files`).
        FileMetadata(
            f"gs://{bucket_name}/{blob.name}",
            blob.size,
            gcsio.GcsIO._updated_to_seconds(blob.updated),
        )
        for blob in pages
    ]
    return top, sorted(f"gs://{bucket_name}/{folder}" for folder in pages.prefixes)


# One Cloud Storage client per process and pipeline options (`_gcs_open`):
# id of the options -> (the options, kept alive so the id stays theirs; the client).
_gcs_clients: dict[int, tuple[Any, Any]] = {}
_gcs_clients_lock = threading.Lock()


def _gcs_open(path: str) -> BinaryIO:
    """A Cloud Storage object's bytes, open for reading: one media GET
    through a client made as Beam's GCS filesystem makes its own
    (`gcsio.create_storage_client`, from the same pipeline options), once
    per process and options and shared by its threads.

    Beam's filesystem makes a client (and its HTTP session: on Cloud
    Storage, a new TLS connection) for every object it opens and asks for
    the object's metadata before its bytes: ~9 ms of CPU per object against
    ~1.5 ms (on the GCS emulator), around an image's own decode time.

    Raises:
      FileNotFoundError: there is no such object.
      google-cloud-storage's errors: any other (access denied, no such
        bucket, no network), which `unreachable_reason` recognizes.
    """
    from apache_beam.io.gcp import gcsio
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.options.value_provider import RuntimeValueProvider
    from google.api_core import exceptions

    options: Any = FileSystems._pipeline_options or RuntimeValueProvider.runtime_options
    if options is None:
        options = PipelineOptions([])
    elif isinstance(options, dict):
        options = PipelineOptions.from_dictionary(options)
    with _gcs_clients_lock:
        known = _gcs_clients.get(id(options))
        if known is None or known[0] is not options:
            known = (options, gcsio.create_storage_client(options))
            _gcs_clients[id(options)] = known
        client = known[1]
    bucket, _, name = path[len("gs://") :].partition("/")
    try:
        data = client.bucket(bucket).blob(name).download_as_bytes()
    except exceptions.NotFound as e:
        raise FileNotFoundError(errno.ENOENT, "no such object", path) from e
    return io.BytesIO(data)


def _gcs_create_exclusive(path: str, data: bytes) -> bool:
    """Creates a GCS object only if no generation of it exists (``ifGenerationMatch=0``)."""
    from google.api_core import exceptions
    from google.cloud import storage as gcs

    bucket_name, _, name = path[len("gs://") :].partition("/")
    blob = gcs.Client().bucket(bucket_name).blob(name)
    try:
        blob.upload_from_string(data, if_generation_match=0)
    except exceptions.PreconditionFailed:
        return False
    return True


def _gcs_replace_if_unchanged(path: str, expected: bytes, data: bytes) -> bool:
    """`Store.replace_if_unchanged` on Cloud Storage: the object read with
    its generation, written with ``ifGenerationMatch`` of that generation."""
    from google.api_core import exceptions
    from google.cloud import storage as gcs

    bucket_name, _, name = path[len("gs://") :].partition("/")
    bucket = gcs.Client().bucket(bucket_name)
    try:
        blob = bucket.get_blob(name)
        if blob is None:
            return False
        if blob.download_as_bytes(if_generation_match=blob.generation) != expected:
            return False
        bucket.blob(name).upload_from_string(data, if_generation_match=blob.generation)
    except (exceptions.PreconditionFailed, exceptions.NotFound):
        return False
    return True


def _loops(directory: str, top: str) -> bool:
    """Whether `directory` (below `top`) is, through links, one of its own ancestors."""
    real = os.path.realpath(directory)
    parent = os.path.dirname(directory)
    while len(parent) >= len(top):
        if os.path.realpath(parent) == real:
            return True
        parent = os.path.dirname(parent)
    return False


def local_file_status(path: str, status: os.stat_result) -> FileStatus:
    """`LocalStore.file_status` of `path` from its ``os.stat`` (or, when it
    is not a symbolic link, its ``os.lstat``: the same)."""
    problem = _special_file_problem(status.st_mode)
    if stat.S_ISDIR(status.st_mode) and _links_to_ancestor(path):
        problem = "a symbolic link to a folder that holds it (not followed: it would loop)"
    return FileStatus(status.st_size, status.st_mtime, problem, inode_ctime(status))


def _links_to_ancestor(path: str) -> bool:
    """Whether `path` is a symbolic link to its own folder or one above it."""
    if not os.path.islink(path):
        return False
    target = os.path.realpath(path)
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    return folder == target or folder.startswith(target.rstrip(os.sep) + os.sep)


def open_input(path: str) -> BinaryIO:
    """An input file (an image, a mask) open for reading its bytes as they
    are (a name ending in ``.gz`` is not decompressed).

    A local path is opened without blocking and refused unless it is a
    regular file: the listing drops named pipes and devices, but one put in
    a listed file's place since (or a mask file, which the job reads) would
    block the job until someone wrote to it. An S3 or Cloud Storage object
    is one GET through a client shared by the process (`_s3_open`,
    `_gcs_open`).

    Raises:
      OSError: the path cannot be opened, or is not a regular file
        (FileNotFoundError: no such file or object).
      BeamIOError: an object cannot be read (botocore's errors on S3,
        google-cloud-storage's on gs://).
    """
    if path.startswith("s3://"):
        return _s3_open(path)
    if path.startswith("gs://"):
        return _gcs_open(path)
    if is_remote(path):
        from apache_beam.io.filesystem import CompressionTypes

        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        problem = _special_file_problem(os.fstat(fd).st_mode)
        if problem:
            raise OSError(errno.EINVAL, problem, path)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def input_stamp(f: BinaryIO, path: str, size_read: int) -> tuple[int, float | None]:
    """The size and modification time of an input `open_input` opened, as
    known without another request, to compare with what the listing said
    of it (`stamp_disagreements`): a local file's own, from the open file
    (`os.fstat`, taken after `size_read` bytes were read, so a write during
    the read shows); an object's size as read (`size_read`, the whole
    object), and no time (None): Beam's readers keep no metadata of the
    object, and asking for its update time would cost a request per object.
    """
    if is_remote(path):
        return size_read, None
    status = os.fstat(f.fileno())
    return status.st_size, status.st_mtime


def is_missing_input(error: BaseException) -> bool:
    """Whether opening or reading an input (`open_input`) failed because
    nothing is there: not a file that exists and cannot be read."""
    details = getattr(error, "exception_details", None) or {}  # Beam's BeamIOError
    if details:
        return all(_is_not_found(problem) for problem in details.values())
    return _is_not_found(error)


def _special_file_problem(mode: int) -> str | None:
    """Why a file of this mode cannot be read as an image, or None.

    Beam lists named pipes, sockets and devices like files, and a manifest
    may name a folder. Reading a named pipe blocks until someone writes to
    it, so such paths must be refused before anything reads them.
    """
    if stat.S_ISREG(mode):
        return None
    kind = (
        "a folder"
        if stat.S_ISDIR(mode)
        else "a named pipe (FIFO)"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device or other special file"
    )
    return f"not a regular file but {kind}"


_LOCAL = LocalStore()
_OBJECT = ObjectStore()


def store_for(path: str) -> Store:
    """The store that holds `path`."""
    if not is_remote(path):
        return _LOCAL
    _apply_pipeline_options()
    return _OBJECT


def read_text(path: str) -> str | None:
    return store_for(path).read_text(path)


def write_text(path: str, text: str) -> None:
    """Writes a small text file atomically (see `Store.write_atomic`)."""
    store_for(path).write_atomic(path, text.encode("utf-8"))


def exists(path: str) -> bool:
    return store_for(path).exists(path)


def delete_tree(folder: str) -> None:
    store_for(folder).delete_tree(folder)


def check_credentials(path: str) -> None:
    """Raises at once if `path` is on an object store that cannot be
    reached for want of credentials (or, on S3, of a network).

    Cloud Storage: the store client's own error if no Google credentials
    can be found. Beam's GCS filesystem, which reads and writes for kiln,
    would instead retry loading them for a minute, then go on anonymously
    and time out after two more (offline).

    S3: `MissingCredentials` if neither the pipeline flags
    (``--s3_access_key_id``...) nor boto3's own search (environment,
    ``~/.aws``, an instance role) give credentials, and botocore's error if
    the endpoint cannot be reached by one bounded request (`_probe_s3`).
    Beam's S3 filesystem retries every failed request that has no HTTP
    status (no credentials, a refused connection) for about nine minutes.

    Call this before a first read that is not preceded by a write through
    the store's own client (the lock's). Other stores and local paths:
    nothing to check.
    """
    if path.startswith("gs://"):
        import google.auth

        google.auth.default()
    elif path.startswith("s3://"):
        _apply_pipeline_options()
        _probe_s3(path)


class MissingCredentials(Exception):
    """No credentials for an object store could be found (`check_credentials`)."""


# How to give Beam's S3 filesystem (and kiln's boto3 calls) credentials: its
# flags, or what boto3 searches when they are not given (docs/dataflow.md).
_S3_CREDENTIALS_HINT = (
    "no AWS credentials found: pass --s3_access_key_id and --s3_secret_access_key "
    "(and --s3_session_token for temporary ones), or set AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, or a profile (AWS_PROFILE, ~/.aws/credentials), or run "
    "where an instance role gives them"
)

# The probe's limits: a refused connection fails at once, an endpoint that
# does not answer within a minute or so, whatever Beam's retries would wait.
_S3_PROBE_CONFIG = {
    "connect_timeout": 5,
    "read_timeout": 20,
    "retries": {"max_attempts": 2, "mode": "standard"},
}


def _probe_s3(path: str) -> None:
    """Raises `MissingCredentials` or botocore's connection error (an
    endpoint that refuses or does not answer) for the bucket of `path`.

    One ``HeadBucket`` through a client made as Beam's S3 filesystem makes
    its own (`apache_beam.io.aws.clients.s3.boto3_client`), from the same
    pipeline options, with short timeouts and one retry. Any answer of the
    store (an access denied, no such bucket) means it was reached: that is
    left to the request that needs the access, which Beam does not retry.
    """
    from apache_beam.options.pipeline_options import PipelineOptions, S3Options
    from botocore.config import Config
    from botocore.exceptions import ClientError
    from botocore.session import get_session  # boto3's sessions are botocore's

    bucket = path[len("s3://") :].partition("/")[0]
    options = (FileSystems._pipeline_options or PipelineOptions([])).view_as(S3Options)
    session = get_session()
    if options.s3_access_key_id is None and session.get_credentials() is None:
        raise MissingCredentials(_S3_CREDENTIALS_HINT)  # the caller names the path
    client = session.create_client(
        "s3",
        region_name=options.s3_region_name,
        api_version=options.s3_api_version,
        use_ssl=not options.s3_disable_ssl,
        verify=options.s3_verify,
        endpoint_url=options.s3_endpoint_url,
        aws_access_key_id=options.s3_access_key_id,
        aws_secret_access_key=options.s3_secret_access_key,
        aws_session_token=options.s3_session_token,
        config=Config(**_S3_PROBE_CONFIG),
    )
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError:
        pass  # the store answered


# The modules whose errors mean that an object store could not be reached or
# refused access: its clients' (credentials, HTTP, API errors), by name, so
# that none of them is imported to recognize them. Beam's S3 filesystem
# wraps each boto3 error in its own S3ClientError (`apache_beam.io.aws.clients`).
_STORE_CLIENT_MODULES = (
    "google.auth.",
    "google.api_core.",
    "google.cloud.",
    "botocore.",
    "boto3.",
    "requests.",
    "urllib3.",
    "apache_beam.io.aws.clients.",
)


def unreachable_reason(error: BaseException) -> str | None:
    """Why an object store could not be reached, in one line, if `error`
    (or its cause, or a path's error inside Beam's ``BeamIOError``) was
    raised by a store's client or is `MissingCredentials`: no credentials,
    no network, access denied, no such bucket. None for an error of any
    other kind (a bug is not reported as an unreachable store).
    """
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        problem = pending.pop(0)
        if id(problem) in seen:
            continue
        seen.add(id(problem))
        if isinstance(problem, (ConnectionError, MissingCredentials)) or any(
            cls.__module__.startswith(_STORE_CLIENT_MODULES) for cls in type(problem).__mro__
        ):
            return _client_message(problem)
        details = getattr(problem, "exception_details", None)  # Beam's BeamIOError
        if isinstance(details, dict):
            pending += [p for p in details.values() if isinstance(p, BaseException)]
        pending += [p for p in (problem.__cause__, problem.__context__) if p is not None]
    return None


def _client_message(problem: BaseException) -> str:
    """The first line of a store client's error, at most 500 characters.

    botocore's NoCredentialsError (a request through Beam's client, the
    lock's) says how to give credentials, as `check_credentials` does.
    Beam's S3ClientError keeps its text in ``message``: its ``str`` is the
    tuple of its arguments (message, HTTP status)."""
    if type(problem).__name__ == "NoCredentialsError":
        return _S3_CREDENTIALS_HINT
    text = str(problem)
    if type(problem).__module__.startswith("apache_beam.io.aws.clients."):
        text = str(getattr(problem, "message", None) or text)
        if "Unable to locate credentials" in text:
            return _S3_CREDENTIALS_HINT
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[0].rstrip(".") if lines else type(problem).__name__)[:500]


def describe_os_error(error: OSError) -> str:
    """``<path>: <strerror>`` for an OS error, e.g. ``/data/x: No space left on device``."""
    reason = error.strerror or errno.errorcode.get(error.errno or 0, "") or str(error)
    return f"{error.filename}: {reason}" if error.filename else reason
