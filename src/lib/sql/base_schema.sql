-- The generation service's own tables, as they exist before the archive feature.
-- Used for local runs and tests only; production already has these tables.
-- Apply archive_migration.sql afterwards (it adds the archive columns and indexes).
CREATE TABLE IF NOT EXISTS users (
    id BIGINT PRIMARY KEY,
    username TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS image_generation_records (
    id BIGINT PRIMARY KEY,
    user_id BIGINT NOT NULL REFERENCES users (id),
    status TEXT NOT NULL,
    prompt TEXT,
    image_url TEXT,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
