"""How many threads OpenCV may use inside one call (a process-wide setting)."""

from __future__ import annotations

import cv2


def set_opencv_threads(count: int) -> int:
    """Sets the threads OpenCV may use inside one call, process-wide.

    Returns:
      The previous setting, to restore later.
    """
    previous = cv2.getNumThreads()
    cv2.setNumThreads(int(count))
    return previous
