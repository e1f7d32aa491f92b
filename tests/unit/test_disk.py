"""DiskThresholds: RocketMQ's cleaning triggers from the disk-usage ratios."""

from __future__ import annotations

from rmq_mp.config.store_config import MessageStoreConfig
from rmq_mp.store.disk import DiskLevel, DiskThresholds


def test_space_trigger_is_disk_max_used_space_ratio_alone() -> None:
    """isSpaceToDelete compares usage with diskMaxUsedSpaceRatio only: set above the
    clean-forcibly ratio (95 against 85), usage of 87% is "clean at once" for a run that the hour
    or a manual request starts, but starts no run itself."""
    high = DiskThresholds.of(MessageStoreConfig(disk_max_used_space_ratio=95))
    assert high.level(0.87) is DiskLevel.CLEAN_FORCIBLY
    assert not high.space_to_delete(0.87)
    assert high.space_to_delete(0.96)
    assert high.space_to_delete(-1.0), "unknown usage counts as full, as RocketMQ's < 0 test"
    default = DiskThresholds.of(MessageStoreConfig())
    assert not default.space_to_delete(0.75)
    assert default.space_to_delete(0.76)
