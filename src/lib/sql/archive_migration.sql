-- Archive columns and indexes on image_generation_records, and the project's own tables.
-- This file is the declaration: `archive-ctl migrate` reads it, compares each statement
-- with the catalog and runs only what is missing, with a short lock_timeout and retries
-- for what needs the table's exclusive lock (docs/explanation/live-migration.md). Each
-- statement must keep one of the shapes it knows: ALTER TABLE ... ADD COLUMN IF NOT
-- EXISTS, CREATE [UNIQUE] INDEX [CONCURRENTLY] IF NOT EXISTS, CREATE TABLE IF NOT EXISTS,
-- INSERT ... ON CONFLICT DO NOTHING, and the CHECK constraint's two DO blocks.
-- `psql -v ON_ERROR_STOP=1 -f` also works and is idempotent, but it is the plain path:
-- every ADD COLUMN asks for the exclusive lock on every run, it maps no legacy value and
-- leaves INVALID indexes of interrupted builds in place. Run it on a quiet table only.
SET lock_timeout = '5s';

-- One migration at a time, archive-ctl's or psql's: a second run waits here, so it
-- never takes the first one's index build, still INVALID while it runs, for an
-- interrupted one. Kept until the session ends. (1634888552 is 'arch' in ASCII.)
SELECT pg_advisory_lock(1634888552);

ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_status TEXT;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_attempts INT NOT NULL DEFAULT 0;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_next_run_at TIMESTAMPTZ;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_locked_by TEXT;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_locked_at TIMESTAMPTZ;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_enqueued_at TIMESTAMPTZ;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_error TEXT;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archived_at TIMESTAMPTZ;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS hosted_image_url TEXT;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS image_mime_type TEXT;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS hosted_response JSONB;
-- The last attempt may have left an image on Lsky that the row does not point at: set by
-- every claim, cleared by the writes that know the host's answer (queries.sql, docs/explanation/one-stored-copy.md).
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_may_be_hosted BOOLEAN NOT NULL DEFAULT false;
-- Lsky stored other bytes than the generated ones (re-encoded, watermarked): true; the
-- same: false; not compared (adopted, archived before the check): NULL.
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_altered BOOLEAN;
-- Where the image was staged (lib.archive.staging) while the host could not take it, and
-- when: the next attempt uploads from there instead of the provider's temporary URL.
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_staged_key TEXT;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_staged_at TIMESTAMPTZ;
-- What was captured (SHA-256 and length of the staged bytes): checked when the copy is
-- read back, so a replaced or truncated object is never archived.
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_staged_sha256 TEXT;
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_staged_bytes BIGINT;
-- Why a PENDING row waits for its due time (lib.state.status.WaitReason): backoff, the
-- host paused the lane, our pacing, our own fault, no time left. NULL: it does not wait.
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_wait_reason TEXT;
-- What an upload whose answer was lost sent (md5, sha1, width, height): the next attempt
-- compares the image it finds on Lsky with it before adopting, without a download.
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_sent JSONB;
-- The first claim that could upload: an image on Lsky older than this is not ours to adopt.
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_first_claimed_at TIMESTAMPTZ;
-- `archive-ctl backfill` queued the row (history), not the generation service (live): the
-- lane serves live rows first (the sweeper sends them first; a backfill takes only the
-- capacity live demand leaves). Set once, never cleared.
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_backfilled BOOLEAN NOT NULL DEFAULT false;
-- When the archive became FAILED: set by every statement that fails a row, cleared by a
-- requeue. NULL on a row an older release failed: readers then take queries.sql's
-- failed_time, which falls back to the last send (docs/reference/database.md, "Failure time").
ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_failed_at TIMESTAMPTZ;

-- The claim is by primary key and needs no index. The sweeper's two scans do:
-- partial indexes keep them proportional to the stale rows, not the table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS image_generation_records_archive_pending_idx
    ON image_generation_records (archive_next_run_at)
    WHERE archive_status = 'PENDING';

CREATE INDEX CONCURRENTLY IF NOT EXISTS image_generation_records_archive_running_idx
    ON image_generation_records (archive_locked_at)
    WHERE archive_status = 'RUNNING';

-- Rows we parked (no message out, waiting for their due time): the sweeper sends them
-- when due, `lane clear` makes those of a pause due now; only they are in it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS image_generation_records_archive_parked_idx
    ON image_generation_records (archive_next_run_at)
    WHERE archive_status = 'PENDING' AND archive_enqueued_at IS NULL
      AND archive_wait_reason IS NOT NULL;

-- PENDING rows a backfill queued: the sweeper reads them after the live ones, and
-- `archive-ctl backfill` counts those in the lane, without reading the live backlog.
CREATE INDEX CONCURRENTLY IF NOT EXISTS image_generation_records_archive_backfilled_idx
    ON image_generation_records (archive_next_run_at)
    WHERE archive_status = 'PENDING' AND archive_backfilled;

-- FAILED rows by generation time. An earlier release's `requeue --since` read it; this one
-- finds failures by when they failed (the next index), which also serves every count of
-- FAILED rows, so nothing reads this one now. Kept: dropping it is not one of the shapes
-- the migration knows, and an older release still running during a deploy uses it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS image_generation_records_archive_failed_idx
    ON image_generation_records (started_at)
    WHERE archive_status = 'FAILED';

-- `archive-ctl list` and `requeue` find failures by when they failed, newest first, and
-- `status` counts those of the last 24 h: on queries.sql's failed_time expression, written
-- the same way there (the planner matches it by its text), with id for the keyset order.
CREATE INDEX CONCURRENTLY IF NOT EXISTS image_generation_records_archive_failed_at_idx
    ON image_generation_records
       ((COALESCE(archive_failed_at,
                  GREATEST(archive_enqueued_at, archive_first_claimed_at, started_at))), id)
    WHERE archive_status = 'FAILED';

-- `archive-ctl backfill` pages through the never-queued SUCCEEDED generations by
-- (started_at, id); the index has only those rows, and a row leaves it when queued.
CREATE INDEX CONCURRENTLY IF NOT EXISTS image_generation_records_archive_backfill_idx
    ON image_generation_records (started_at, id)
    WHERE archive_status IS NULL AND status = 'SUCCEEDED';

-- `archive-ctl status` counts the archives Lsky altered, by archive time.
CREATE INDEX CONCURRENTLY IF NOT EXISTS image_generation_records_archive_altered_idx
    ON image_generation_records (archived_at)
    WHERE archive_altered;

-- Staged copies (`archive-ctl status`, the StagedOldestAgeSeconds metric): only rows that
-- hold one are in it, so counting them and finding the oldest never reads the table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS image_generation_records_archive_staged_idx
    ON image_generation_records (archive_staged_at)
    WHERE archive_staged_key IS NOT NULL;

-- archive_status takes only the names of lib.state.status.ArchiveStatus (or NULL: never
-- queued). Added NOT VALID (a brief exclusive lock, no scan), then validated, which scans
-- without blocking reads or writes; both are no-ops once done.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conrelid = 'image_generation_records'::regclass
          AND conname = 'image_generation_records_archive_status_check'
    ) THEN
        ALTER TABLE image_generation_records
            ADD CONSTRAINT image_generation_records_archive_status_check
            CHECK (archive_status IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED')) NOT VALID;
    END IF;
END
$$;

-- A NOT VALID constraint still refuses every UPDATE of a row with another value, so
-- one that cannot be validated is dropped again rather than left behind.
DO $$
BEGIN
    ALTER TABLE image_generation_records
        VALIDATE CONSTRAINT image_generation_records_archive_status_check;
EXCEPTION WHEN check_violation THEN
    ALTER TABLE image_generation_records
        DROP CONSTRAINT image_generation_records_archive_status_check;
    RAISE WARNING 'archive_status holds other values than the CHECK allows; constraint dropped again (archive-ctl migrate --dry-run lists them)';
END
$$;

-- The upload lane to the image host, shared by every container: a pause for host-level
-- conditions (rate limits, account problems) and a version every pause and pacing slot
-- bumps (lib.state.lane_store). One row per host account ('lsky'); the project's own
-- table. upload_times is an earlier release's log, unused now (the ledger below is it).
CREATE TABLE IF NOT EXISTS image_archive_lane (
    lane TEXT PRIMARY KEY,
    paused_until TIMESTAMPTZ,
    pause_reason TEXT,
    pause_window TEXT,
    pause_detail TEXT,
    paused_since TIMESTAMPTZ,
    upload_times TIMESTAMPTZ[] NOT NULL DEFAULT '{}',
    version BIGINT NOT NULL DEFAULT 0
);

INSERT INTO image_archive_lane (lane) VALUES ('lsky') ON CONFLICT (lane) DO NOTHING;

-- The lane's upload ledger: one row per upload (state done: when Lsky answered; taken:
-- an upload under way) and per booked slot (state booked: a future upload time kept for
-- record_id). Rows older than two hours are rolled up into image_archive_upload_hours by
-- the sweeper, so the table keeps hours, not months of rows (lib.state.lane_store).
CREATE TABLE IF NOT EXISTS image_archive_uploads (
    lane TEXT NOT NULL DEFAULT 'lsky',
    at TIMESTAMPTZ NOT NULL,
    record_id BIGINT,
    state TEXT NOT NULL DEFAULT 'done' CHECK (state IN ('booked', 'taken', 'done'))
);

CREATE INDEX IF NOT EXISTS image_archive_uploads_at_idx ON image_archive_uploads (lane, at);

CREATE INDEX IF NOT EXISTS image_archive_uploads_record_idx
    ON image_archive_uploads (record_id) WHERE state <> 'done';

-- Uploads per hour, older than the ledger's two hours, for a day, week or month window.
CREATE TABLE IF NOT EXISTS image_archive_upload_hours (
    lane TEXT NOT NULL,
    hour TIMESTAMPTZ NOT NULL,
    uploads INT NOT NULL,
    PRIMARY KEY (lane, hour)
);

-- Of an hour's uploads, those of backfilled records: live demand over a day, week or month
-- window is the rest (`archive-ctl status` and `backfill`).
ALTER TABLE image_archive_upload_hours ADD COLUMN IF NOT EXISTS backfill_uploads INT NOT NULL DEFAULT 0;

-- Every record's story (lib.state.events, docs/explanation/stories.md): one row per event, written by
-- the statements that change the record; an attempt's own events are carried in memory to
-- the statement that concludes it. `seq` orders the events one statement writes at one
-- time. The kinds mirror lib.state.events.EventKind. The sweeper removes a record's events
-- ARCHIVE_EVENT_RETENTION_DAYS after the conclusion (archived, failed) they lead to.
CREATE TABLE IF NOT EXISTS image_archive_events (
    record_id BIGINT NOT NULL,
    at TIMESTAMPTZ NOT NULL,
    attempt INT NOT NULL DEFAULT 0,
    seq SMALLINT NOT NULL DEFAULT 0,
    kind TEXT NOT NULL,
    detail JSONB NOT NULL DEFAULT '{}'
);

-- The kinds of event mirror lib.state.events.EventKind. A release that adds kinds changes
-- the list here: a constraint that lacks one of them (an older release's, which the
-- CREATE TABLE of that release wrote inline) is replaced, added NOT VALID (a brief
-- exclusive lock, no scan), then validated without blocking writes. `archive-ctl
-- migrate` compares the allowed values with the catalog's; the plain psql path replaces
-- it when the newest kind is missing.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conrelid = 'image_archive_events'::regclass
          AND conname = 'image_archive_events_kind_check'
          AND pg_get_constraintdef(oid) LIKE '%''lost_on_host''%'
    ) THEN
        ALTER TABLE image_archive_events DROP CONSTRAINT IF EXISTS image_archive_events_kind_check;
        ALTER TABLE image_archive_events
            ADD CONSTRAINT image_archive_events_kind_check CHECK (kind IN (
                'enqueued', 'unsent', 'dequeued', 'dated', 'received', 'claimed',
                'lock_taken_over', 'lock_lost', 'fetched', 'staged', 'slot', 'lane_paused',
                'looked_up', 'upload_answered', 'held', 'parked', 'unparked', 'retried',
                'failed', 'archived', 'audited', 'original_kept', 'restored',
                'lost_on_host')) NOT VALID;
    END IF;
END
$$;
ALTER TABLE image_archive_events VALIDATE CONSTRAINT image_archive_events_kind_check;
-- `archive-ctl show` and the retention: one record's events (tens of them: sorted in
-- memory). On the record id alone, B-tree deduplication keeps an event's entry to a few
-- bytes (docs/performance.md).
CREATE INDEX IF NOT EXISTS image_archive_events_record_idx
    ON image_archive_events (record_id);

-- Retention: the conclusions, oldest first; the sweeper removes the events up to each.
CREATE INDEX IF NOT EXISTS image_archive_events_concluded_idx
    ON image_archive_events (at) WHERE kind IN ('archived', 'failed');

-- The audit's own events, by time: it removes them after the retention (they come after a
-- record's conclusion, so the story's retention does not take them).
CREATE INDEX IF NOT EXISTS image_archive_events_audit_idx
    ON image_archive_events (at) WHERE kind IN ('audited', 'original_kept', 'lost_on_host');
-- How far the archive function has read the archive queue: the newest SentTimestamp among
-- the messages it received for the first time (the claim moves it on, never back; at most
-- to the database's now()). The sweeper's lost-message rule compares a PENDING row's entry
-- into the queue with it (lib.archive.sweep_rules). One row per queue.
CREATE TABLE IF NOT EXISTS image_archive_queue (
    queue TEXT PRIMARY KEY,
    received_through TIMESTAMPTZ
);

INSERT INTO image_archive_queue (queue) VALUES ('archive') ON CONFLICT (queue) DO NOTHING;

-- Completion events waiting to be published on EventBridge (lib.publish; docs/reference/events-and-metrics.md,
-- "Completion events"). The statement that concludes a record (archived, failed) writes its
-- event here in the same statement; the archive function publishes it right after and its
-- next claim deletes it, and the sweeper publishes what is still here after the grace
-- period. Only pending events stay: a published or dropped one is deleted, and the story's
-- conclusion event notes it. The detail types mirror lib.publish.entries.DetailType.
-- tries: publications that failed; rejections: those EventBridge refused for good (an
-- entry is dropped after a few); retry_at: a sweeper keeps it until then while it publishes.
CREATE TABLE IF NOT EXISTS image_archive_outbox (
    event_id UUID PRIMARY KEY,
    record_id BIGINT NOT NULL,
    detail_type TEXT NOT NULL CONSTRAINT image_archive_outbox_detail_type_check CHECK (
        detail_type IN ('Image Archived', 'Image Archive Failed', 'Image Restored')),
    detail JSONB NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    tries INT NOT NULL DEFAULT 0,
    rejections INT NOT NULL DEFAULT 0,
    last_error TEXT,
    retry_at TIMESTAMPTZ
);

-- The sweeper takes the oldest first, `status` and the EventsUnpublished metric read the
-- oldest: one index entry.
CREATE INDEX IF NOT EXISTS image_archive_outbox_created_idx ON image_archive_outbox (created_at);

-- Data steps `archive-ctl migrate` has begun and not finished, one row each: noted before
-- the schema change that calls for it, its keyset progress kept batch by batch, deleted
-- when done. A run that stops half-way (a lost connection, Ctrl-C, a step that gave up)
-- leaves its row, and the next run finishes the step. Only migrate (the owner) uses it.
CREATE TABLE IF NOT EXISTS image_archive_migration_steps (
    step TEXT PRIMARY KEY,
    after_id BIGINT,
    noted_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- Every archived image's original, kept in the originals bucket (lib.archive.originals):
-- where (bucket, key and S3's version: reads take that version), what (SHA-256, length,
-- type: checked when it is read back) and from where: `archive` the bytes sent to Lsky,
-- `staged` a staged copy, `hosted` the audit's GET of the hosted file when it matched what
-- Lsky reported, `provider` the provider's URL fetched again with the bytes first sent.
CREATE TABLE IF NOT EXISTS image_archive_originals (
    record_id BIGINT PRIMARY KEY,
    bucket TEXT NOT NULL,
    key TEXT NOT NULL,
    version_id TEXT,
    sha256 TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    mime_type TEXT NOT NULL,
    source TEXT NOT NULL CHECK (source IN ('archive', 'staged', 'hosted', 'provider')),
    kept_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- Whether S3's answer to the original's PUT was seen: the success write records an original
-- whose body went out whole without waiting for it (`false`, version unknown); the
-- container's next claim, or else the audit's HEAD, confirms it with its version. Rows an
-- older release wrote (it always waited) read as confirmed.
ALTER TABLE image_archive_originals ADD COLUMN IF NOT EXISTS confirmed BOOLEAN NOT NULL DEFAULT true;
-- The audit finds the unconfirmed ones by age, and `status` counts them: few, whatever the
-- table's size.
CREATE INDEX IF NOT EXISTS image_archive_originals_unconfirmed_idx
    ON image_archive_originals (kept_at)
    WHERE NOT confirmed;
-- The audit of the hosted images (lib.audit): one row per archived record, written by the
-- success write and, for records archived before it, by the auditor's walk. `due_at` is
-- when it is checked next (the rotation reads its index, never the records); the verdict
-- is the last one a check reached (unreachable checks reach none); `lost`: missing or
-- altered with nothing to restore it from. The generation's row is never written by a
-- check that finds nothing wrong.
CREATE TABLE IF NOT EXISTS image_archive_audits (
    record_id BIGINT PRIMARY KEY,
    due_at TIMESTAMPTZ NOT NULL,
    checked_at TIMESTAMPTZ,
    verdict TEXT CHECK (verdict IN ('intact', 'missing', 'altered')),
    verdict_since TIMESTAMPTZ,
    checked_url TEXT,
    unreachable_since TIMESTAMPTZ,
    lost BOOLEAN NOT NULL DEFAULT false,
    detail JSONB NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS image_archive_audits_due_idx ON image_archive_audits (due_at);
-- What is wrong now: `restore --missing/--altered`, `list --lost`, `status`; few rows.
CREATE INDEX IF NOT EXISTS image_archive_audits_wrong_idx
    ON image_archive_audits (verdict, record_id) WHERE verdict <> 'intact';
-- Restores under way: the record is archived again from its original (the claim reads it
-- from here); the success write replaces the hosted URL, names the old one in the story
-- and deletes the row.
CREATE TABLE IF NOT EXISTS image_archive_restores (
    record_id BIGINT PRIMARY KEY,
    requested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    reason TEXT NOT NULL CHECK (reason IN ('missing', 'altered', 'operator')),
    requested_by TEXT NOT NULL,
    old_url TEXT,
    old_key TEXT
);
-- The auditor's walk over the records by id, enrolling archived ones the success write did
-- not (archived before this release, or by an older release still running): a pass a
-- period, a few pages a run.
CREATE TABLE IF NOT EXISTS image_archive_audit_walk (
    walk TEXT PRIMARY KEY,
    after_id BIGINT,
    started_at TIMESTAMPTZ,
    finished_at TIMESTAMPTZ
);
INSERT INTO image_archive_audit_walk (walk) VALUES ('archived') ON CONFLICT (walk) DO NOTHING;
