"""How much OpenCV logs to stderr (a process-wide setting)."""

from __future__ import annotations

import cv2

# The variable OpenCV reads its level from when its logger starts.
ENV = "OPENCV_LOG_LEVEL"
FATAL = cv2.utils.logging.LOG_LEVEL_FATAL


def set_opencv_log_level(level: int) -> int:
    """Sets the level of OpenCV's own log lines, process-wide.

    Args:
      level: One of ``cv2.utils.logging.LOG_LEVEL_*`` (`FATAL`: only the
        lines before OpenCV aborts).

    Returns:
      The previous level, to restore later.
    """
    previous = int(cv2.utils.logging.getLogLevel())
    cv2.utils.logging.setLogLevel(int(level))
    return previous
