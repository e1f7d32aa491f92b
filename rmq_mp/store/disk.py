"""Disk usage of a store's partitions and RocketMQ's three thresholds (docs/format.md §10).

`diskMaxUsedSpaceRatio` (75 %) lets expired files be deleted at any hour; above
`diskSpaceCleanForciblyRatio` (85 %) unexpired files may go too (`cleanFileForciblyEnable`);
above `diskSpaceWarningLevelRatio` (90 %) the store is DISK_FULL and refuses puts. Values are
the config's effective ones (clamped as RocketMQ clamps them). Ratios are RocketMQ's: used /
(used + available to us), rounded up to a whole percent; -1 when the path cannot be measured.
"""

from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.outcomes import RunningFlags


def disk_used_ratio(path: str | os.PathLike[str]) -> float:
    """`UtilAll.getDiskPartitionSpaceUsedPercent`: used / (used + available), rounded up to 1 %."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    return math.ceil(used * 100 / entire) / 100 if entire else -1.0


class DiskLevel(enum.IntEnum):
    """Where a ratio stands against the thresholds, lowest first."""

    UNKNOWN = -1
    OK = 0
    ABOVE_MAX_USED = 1
    CLEAN_FORCIBLY = 2
    WARNING = 3


@dataclass(frozen=True, slots=True)
class DiskThresholds:
    max_used: float
    clean_forcibly: float
    warning: float

    @classmethod
    def of(cls, config: MessageStoreConfig) -> DiskThresholds:
        return cls(
            config.disk_max_used_space_ratio / 100,
            config.disk_space_clean_forcibly_ratio / 100,
            config.disk_space_warning_level_ratio / 100,
        )

    def space_to_delete(self, ratio: float) -> bool:
        """RocketMQ's isSpaceToDelete for one partition: unknown usage, or above diskMaxUsedSpaceRatio,
        whatever the other ratios are (one set above it does not make this true earlier)."""
        return ratio < 0 or ratio > self.max_used

    def level(self, ratio: float) -> DiskLevel:
        if ratio < 0:
            return DiskLevel.UNKNOWN
        if ratio > self.warning:
            return DiskLevel.WARNING
        if ratio > self.clean_forcibly:
            return DiskLevel.CLEAN_FORCIBLY
        return DiskLevel.ABOVE_MAX_USED if ratio > self.max_used else DiskLevel.OK

    def describe(self, what: str, ratio: float) -> str:
        """One phrase naming the ratio and the threshold it crossed, for logs and refusals."""
        level = self.level(ratio)
        if level is DiskLevel.UNKNOWN:
            return f"{what} disk usage unknown"
        name, limit = {
            DiskLevel.WARNING: ("diskSpaceWarningLevelRatio", self.warning),
            DiskLevel.CLEAN_FORCIBLY: ("diskSpaceCleanForciblyRatio", self.clean_forcibly),
            DiskLevel.ABOVE_MAX_USED: ("diskMaxUsedSpaceRatio", self.max_used),
            DiskLevel.OK: ("diskMaxUsedSpaceRatio", self.max_used),
        }[level]
        relation = "<=" if level is DiskLevel.OK else ">"
        return f"{what} disk {ratio:.0%} used {relation} {name} {limit:.0%}"


def not_writeable_reason(flags: int, disk_used_permille: int, config: MessageStoreConfig) -> str:
    """Why puts are refused, naming the flags and, for DISK_FULL, the ratio that set it."""
    reason = f"store not writable: {'|'.join(RunningFlags.names(flags))}"
    if flags & RunningFlags.DISK_FULL:
        ratio = disk_used_permille / 1000
        reason += f" ({DiskThresholds.of(config).describe('commit-log', ratio)})"
    return reason
