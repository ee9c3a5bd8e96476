-- The file's journal mode (`wal` once `SqliteBackend::open` has set it).
PRAGMA journal_mode
