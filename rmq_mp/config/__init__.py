"""Settings and metadata files: broker.conf (`MessageStoreConfig`) and config/*.json."""
