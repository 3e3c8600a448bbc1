"""The error report: one row per dropped input file, written as errors.jsonl.

A bad input file never fails the job. It becomes a `DroppedFile` row, is
counted per reason, and lands in ``errors.jsonl`` beside the shards, sorted so
the same inputs give the same bytes. Whether too many were dropped is decided
by the launcher (``errors.max_fraction``), after the job.

Stages and reasons (part of kiln's output format):

- ``list``: ``bad_row`` (a manifest row that does not parse), ``missing`` (a
  manifest names a file that does not exist), ``unknown_label`` (not in the
  class list), ``unexpected_location`` (a file outside the folder layout),
  ``duplicate_key`` (a manifest lists one path with different labels or
  splits), ``missing_split`` (``splits.from_source`` but the row has none),
  ``unreadable`` (a local path that is not a regular file: a folder, a
  named pipe, a socket or a device).
- ``read``: ``unreadable`` (permission denied, I/O error, vanished since listing).
- ``decode``: the reasons of `kiln.transforms.decode.DecodeError` (``empty``,
  ``not_an_image``, ``unsupported_format``, ``corrupt``, ``too_many_pixels``,
  ``too_small``).
- ``transform``: ``transform_failed`` (a transform cannot apply to this
  image, e.g. smaller than a crop).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from kiln.schemas import ERRORS_FILENAME


@dataclasses.dataclass(frozen=True, order=True)
class DroppedFile:
    """One dropped input file. Field order is the report's sort order."""

    key: str
    stage: str
    reason: str
    uri: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "uri": self.uri,
            "stage": self.stage,
            "reason": self.reason,
            "message": self.message,
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> "DroppedFile":
        return cls(row["key"], row["stage"], row["reason"], row["uri"], row["message"])


def render(rows: list[DroppedFile]) -> bytes:
    """The bytes of errors.jsonl: rows sorted, one canonical JSON object per line."""
    lines = [json.dumps(row.to_json(), sort_keys=True, ensure_ascii=False) + "\n"
             for row in sorted(rows)]
    return "".join(lines).encode("utf-8")


class _WriteReportFn(beam.DoFn):
    def __init__(self, folder: str):
        self._folder = folder

    def process(self, rows: list[DroppedFile]):
        path = FileSystems.join(self._folder, ERRORS_FILENAME)
        # One small object write: a retry rewrites the same bytes.
        with FileSystems.create(path) as f:
            f.write(render(rows))
        counts: dict[str, int] = {}
        for row in rows:
            counts[row.reason] = counts.get(row.reason, 0) + 1
        yield dict(sorted(counts.items()))


class WriteErrorReport(beam.PTransform):
    """Writes all dropped-file rows to ``<folder>/errors.jsonl``, sorted.

    Input: PCollection[DroppedFile]. Output: a single dict, reason -> count
    (an empty file and ``{}`` when nothing was dropped).

    The rows are gathered on one worker to sort them: fine for an error
    report, which `errors.max_fraction` keeps to a small part of the input.
    """

    def __init__(self, folder: str):
        super().__init__()
        self._folder = folder

    def expand(self, dropped):
        return (
            dropped
            | "GatherDropped" >> beam.combiners.ToList()  # [DroppedFile]
            | "WriteErrorsJsonl" >> beam.ParDo(_WriteReportFn(self._folder))  # {reason: count}
        )
