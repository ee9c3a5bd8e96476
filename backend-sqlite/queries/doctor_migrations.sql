-- The migrations applied to the file, for `doctor` to compare with this build's.
SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version
