"""The store directory as files: mapped files, CommitLog, ConsumeQueue, index, checkpoint,
dispatch, recovery, cleaning rules and `MessageStore`, the library's own engine."""
