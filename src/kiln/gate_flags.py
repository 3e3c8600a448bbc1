"""The threshold flags of `kiln diff`, which `kiln build` takes as its publish gate.

Plain argparse, so that ``--help`` imports nothing heavy; the values become a
`kiln.schemas.version_diff.Thresholds` (its fields have the flags' names).
"""

from __future__ import annotations

import argparse
from typing import Any

# The flags that take a limit (0 or more); the others are switches.
_LIMITS = ("max_share_shift", "max_changed_percent", "max_object_change", "max_split_shrink")
_SWITCHES = (
    "fail_on_vanished_class",
    "fail_on_vanished_split",
    "fail_on_label_change",
    "fail_on_config_change",
)


def add_arguments(parser: argparse.ArgumentParser | Any, *, crossing: str) -> None:
    """Adds the threshold flags to `parser` (or an argument group).

    Args:
      crossing: What crossing a threshold does, e.g. ``"exit 1"``.
    """
    parser.add_argument(
        "--max-share-shift",
        type=float,
        metavar="POINTS",
        help=f"{crossing} if a class's share of the dataset moved by more than POINTS "
        f"percentage points",
    )
    parser.add_argument(
        "--max-changed-percent",
        type=float,
        metavar="PERCENT",
        help=f"{crossing} if more than PERCENT%% of the old version's records were added, "
        f"removed, changed or moved",
    )
    parser.add_argument(
        "--fail-on-vanished-class",
        action="store_true",
        help=f"{crossing} if a class that had examples has none now",
    )
    parser.add_argument(
        "--fail-on-vanished-split",
        action="store_true",
        help=f"{crossing} if a split that had examples has none now (a source's split folder gone)",
    )
    parser.add_argument(
        "--max-split-shrink",
        type=float,
        metavar="PERCENT",
        help=f"{crossing} if a split lost more than PERCENT%% of its records (a vanished "
        f"split lost 100%%)",
    )
    parser.add_argument(
        "--max-object-change",
        type=float,
        metavar="PERCENT",
        help=f"datasets with boxes: {crossing} if a class's object count changed by more "
        f"than PERCENT%% of its old count",
    )
    parser.add_argument(
        "--fail-on-label-change",
        action="store_true",
        help=f"{crossing} if a class's label id changed (a model trained on the old "
        f"version would read the new one's labels wrongly)",
    )
    parser.add_argument(
        "--fail-on-config-change",
        action="store_true",
        help=f"{crossing} if the build config changed (transforms, image size, "
        f"encoding...: unchanged sources are stored otherwise)",
    )


def values(args: argparse.Namespace) -> dict[str, Any]:
    """The flags' values by threshold name (`Thresholds`' fields).

    Raises:
      ValueError: naming the flag, for a negative limit.
    """
    for name in _LIMITS:
        value = getattr(args, name)
        if value is not None and not value >= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be 0 or more, got {value}")
    return {name: getattr(args, name) for name in (*_LIMITS, *_SWITCHES)}
