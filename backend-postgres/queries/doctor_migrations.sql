-- The migrations applied to the schema, for `PgBackend::doctor` to compare with this build's.
SELECT version, success, checksum FROM {schema}._sqlx_migrations ORDER BY version
