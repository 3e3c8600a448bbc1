"""An in-memory object store behind Beam's FileSystems, shaped like GCS.

Scheme ``memgs://``. Like Cloud Storage it has no directories (a "folder" is
a name prefix), an object appears only when its writer is closed (a single
object write is atomic), and rename is copy-then-delete. It lets the tests
run kiln's gs:// code paths (listing by prefix, publishing file by file with
kiln.json last, LATEST as one object write) without a network.

Objects live in a class-level dict, shared by every instance Beam creates,
within one process: use it with the in-memory local runner only. Every
completed write and delete is appended to `EVENTS` so tests can check the
order in which a build made things visible, and every request about one
object (metadata, exists) to `OBJECT_REQUESTS` and every listing of a
prefix to `LIST_REQUESTS`, so they can count them. Each function in
`WATCHERS` is called with every event as it happens, outside the store's
lock: a test can interrupt a build at a chosen write or delete (e.g. send
the process SIGTERM while it copies its version into place).
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable

from apache_beam.io.filesystem import (
    BeamIOError,
    CompressedFile,
    CompressionTypes,
    FileMetadata,
    FileSystem,
)

SCHEME = "memgs"
OBJECTS: dict[str, tuple[bytes, float]] = {}
EVENTS: list[tuple[str, str]] = []  # ("write" | "delete", path)
OBJECT_REQUESTS: list[tuple[str, str]] = []  # ("metadata" | "exists", path)
LIST_REQUESTS: list[str] = []  # the prefix listed
WATCHERS: list[Callable[[str, str], None]] = []  # called with each event: (kind, path)
_LOCK = threading.Lock()


def reset() -> None:
    with _LOCK:
        OBJECTS.clear()
        EVENTS.clear()
        WATCHERS.clear()
        OBJECT_REQUESTS.clear()
        LIST_REQUESTS.clear()


def put(path: str, data: bytes, ago: float = 0.0) -> None:
    """Puts an object, updated now or `ago` seconds back."""
    with _LOCK:
        OBJECTS[path] = (bytes(data), time.time() - ago)


def get(path: str) -> bytes:
    return OBJECTS[path][0]


def names(prefix: str = "") -> list[str]:
    return sorted(p for p in OBJECTS if p.startswith(prefix))


def _notify(kind: str, path: str) -> None:
    for watch in list(WATCHERS):
        watch(kind, path)


class _Writer(io.BytesIO):
    """Buffers an object; it becomes visible, whole, on close."""

    def __init__(self, path: str):
        super().__init__()
        self._path = path

    def close(self):
        if self.closed:
            return
        with _LOCK:
            OBJECTS[self._path] = (self.getvalue(), time.time())
            EVENTS.append(("write", self._path))
        super().close()
        _notify("write", self._path)


class InMemoryObjectStore(FileSystem):
    @classmethod
    def scheme(cls):
        return SCHEME

    def join(self, basepath, *paths):
        return "/".join([basepath.rstrip("/")] + [p.strip("/") for p in paths])

    def split(self, path):
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def mkdirs(self, path):
        pass  # no directories

    def has_dirs(self):
        return False

    def _list(self, dir_or_prefix):
        with _LOCK:
            LIST_REQUESTS.append(dir_or_prefix)
        for path in names(dir_or_prefix):
            data, mtime = OBJECTS[path]
            yield FileMetadata(path, len(data), mtime)

    def list_folder_level(self, prefix):
        """`storage.folder_level`: the objects directly under `prefix` and its
        folders, as a delimiter listing gives them (GCS, S3)."""
        with _LOCK:
            LIST_REQUESTS.append(f"{prefix} (folders)")
        objects, folders = [], set()
        for path in names(prefix):
            rest = path[len(prefix) :]
            if "/" in rest:
                folders.add(prefix + rest.split("/", 1)[0] + "/")
            else:
                objects.append(path)
        return objects, sorted(folders)

    def create(
        self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO
    ):
        writer = _Writer(path)
        compression_type = FileSystem._get_compression_type(path, compression_type)
        if compression_type == CompressionTypes.UNCOMPRESSED:
            return writer
        return CompressedFile(writer, compression_type=compression_type)

    def open(
        self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO
    ):
        if path not in OBJECTS:
            raise BeamIOError("Open failed", {path: FileNotFoundError(path)})
        reader = io.BytesIO(OBJECTS[path][0])
        compression_type = FileSystem._get_compression_type(path, compression_type)
        if compression_type == CompressionTypes.UNCOMPRESSED:
            return reader
        return CompressedFile(reader, compression_type=compression_type)

    def copy(self, source_file_names, destination_file_names):
        for source, destination in zip(source_file_names, destination_file_names, strict=True):
            with _LOCK:
                if source not in OBJECTS:
                    raise BeamIOError("Copy failed", {(source, destination): FileNotFoundError()})
                OBJECTS[destination] = (OBJECTS[source][0], time.time())
                EVENTS.append(("write", destination))
            _notify("write", destination)

    def rename(self, source_file_names, destination_file_names):
        self.copy(source_file_names, destination_file_names)
        self.delete(source_file_names)

    def exists(self, path):
        OBJECT_REQUESTS.append(("exists", path))
        return path in OBJECTS

    def size(self, path):
        return len(OBJECTS[path][0])

    def last_updated(self, path):
        return OBJECTS[path][1]

    def checksum(self, path):
        return str(len(OBJECTS[path][0]))

    def metadata(self, path):
        OBJECT_REQUESTS.append(("metadata", path))
        if path not in OBJECTS:
            raise BeamIOError("Metadata failed", {path: FileNotFoundError(path)})
        data, mtime = OBJECTS[path]
        return FileMetadata(path, len(data), mtime)

    def delete(self, paths):
        for path in paths:
            with _LOCK:
                doomed = (
                    [path]
                    if path in OBJECTS
                    else [p for p in OBJECTS if p.startswith(path.rstrip("/") + "/")]
                )
            for p in doomed:
                with _LOCK:
                    if p not in OBJECTS:
                        continue
                    del OBJECTS[p]
                    EVENTS.append(("delete", p))
                _notify("delete", p)
