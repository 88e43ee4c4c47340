-- Every statement the service runs on image_generation_records, by name.
-- Loaded by lib.state.queries: a block starts at `-- name: NAME`; `{{NAME}}` inside a
-- block is replaced by the named fragment. Status names here mirror
-- lib.state.status.ArchiveStatus and the CHECK constraint of archive_migration.sql.

-- name: lock_time_expired
-- The lock-expiry rule, written once: the claim, the sweeper and `status` agree on it.
archive_locked_at < now() - make_interval(secs => :lock_ttl)

-- name: lock_expired
-- A RUNNING row without a lock time counts as expired too.
(archive_locked_at IS NULL OR {{lock_time_expired}})

-- name: producer_enqueued
-- The generation service's enqueue, which writes no event (docs/explanation/stories.md): inferred from
-- the row by the first statement that writes an event for a record that has none: the
-- claim, or the sweeper's. As a row of (at, seq, attempt, kind, detail) for the record
-- `target` (id, archive_status, enqueued_at, next_run_at).
SELECT COALESCE(target.enqueued_at, target.next_run_at, now()) AS at, 0 AS seq, 0 AS attempt,
       'enqueued' AS kind, jsonb_build_object('by', 'producer', 'inferred', true) AS detail
WHERE target.archive_status IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM image_archive_events AS told WHERE told.record_id = target.id)

-- name: claim
-- Claim a record and explain a lost claim, in one round trip. `target` reads the row as
-- it was; `claimed` is the conditional UPDATE (under READ COMMITTED it re-checks its
-- WHERE on a row another claimer just changed, so exactly one wins). Re-running it with
-- the same owner (after a lost connection) returns the row without counting twice.
-- `exhausted` concludes an expired lock on the last attempt, as the sweeper would;
-- its condition excludes `claimed`'s, so the two never touch the same row.
-- archive_may_be_hosted: `target` returns it as the last attempt left it (the Task's
-- may_be_hosted); `claimed` sets it, since this attempt may upload and then vanish.
-- `received` moves the queue's receive mark on (the sweeper's lost-message rule) to
-- :queue_mark, the SentTimestamp of a message received for the first time (NULL
-- otherwise): never back, never past now(), and only by a second or more, so that a
-- burst sent together writes it once. A mark another claim has locked is skipped, never
-- waited for: the mark then lags, which can only delay a re-send, not cause one.
WITH lane AS (
    SELECT paused_until, {{lane_paused_for}} AS paused_for,
           pause_reason, pause_window, pause_detail, paused_since
    FROM image_archive_lane
    WHERE lane = 'lsky'
),
booking AS (
    -- This record's booked upload slot (pacing), and the end of the lane's booked queue.
    SELECT max(at) FILTER (WHERE record_id = :record_id) AS mine, max(at) AS queue_end
    FROM image_archive_uploads
    WHERE state = 'booked'
),
target AS (
    SELECT id, status, archive_status,
           {{lock_expired}} AS lock_expired,
           archive_may_be_hosted AS may_be_hosted,
           EXTRACT(EPOCH FROM archive_next_run_at - now()) AS due_in,
           archive_attempts, archive_locked_by, archive_locked_at,
           archive_enqueued_at AS enqueued_at, archive_next_run_at AS next_run_at
    FROM image_generation_records
    WHERE id = :record_id
),
claimed AS (
    UPDATE image_generation_records AS r
    SET archive_status = 'RUNNING',
        archive_attempts = CASE WHEN r.archive_locked_by = :owner
                                THEN r.archive_attempts ELSE r.archive_attempts + 1 END,
        archive_locked_by = :owner,
        archive_locked_at = now(),
        archive_may_be_hosted = true,
        -- Unknown for a row an older release claimed: then no image is too old to adopt.
        archive_first_claimed_at = COALESCE(r.archive_first_claimed_at,
                                            CASE WHEN r.archive_attempts = 0 THEN now() END),
        archive_wait_reason = NULL
    WHERE r.id = :record_id
      AND r.status = 'SUCCEEDED'
      AND ((r.archive_status = 'PENDING'
            AND (r.archive_next_run_at IS NULL
                 OR r.archive_next_run_at <= now() + make_interval(secs => :early_slack)))
           OR (r.archive_status = 'RUNNING'
               AND (r.archive_locked_by = :owner
                    OR ({{lock_expired}} AND r.archive_attempts < :max_attempts))))
      -- A paused lane takes no new attempt: the message waits, no attempt is spent.
      -- With staging on (:capture_while_paused), a row not staged yet is still taken:
      -- it is captured before its source URL expires, then given back to wait.
      AND (NOT EXISTS (SELECT 1 FROM lane WHERE lane.paused_until > now())
           OR (CAST(:capture_while_paused AS boolean) AND r.archive_staged_key IS NULL))
    RETURNING r.id, r.user_id, r.image_url, r.started_at, r.archive_attempts,
              r.archive_staged_key, r.archive_staged_sha256, r.archive_staged_bytes,
              r.archive_first_claimed_at, r.archive_sent
),
received AS (
    UPDATE image_archive_queue
    SET received_through = LEAST(CAST(:queue_mark AS timestamptz), now())
    WHERE ctid = (SELECT ctid FROM image_archive_queue
                  WHERE queue = 'archive'
                    -- LEAST ignores a NULL: no mark, no move.
                    AND CAST(:queue_mark AS timestamptz) IS NOT NULL
                    AND (received_through IS NULL
                         OR received_through < LEAST(CAST(:queue_mark AS timestamptz), now())
                                               - interval '1 second')
                  FOR UPDATE SKIP LOCKED)
    RETURNING 1
),
exhausted AS (
    UPDATE image_generation_records AS r
    SET archive_status = 'FAILED',
        archive_error = 'lock expired after the last attempt',
        archive_failed_at = now(),
        archive_next_run_at = NULL,
        archive_locked_by = NULL,
        archive_locked_at = NULL
    WHERE r.id = :record_id
      AND r.status = 'SUCCEEDED'
      AND r.archive_status = 'RUNNING'
      AND r.archive_locked_by IS DISTINCT FROM :owner
      AND {{lock_expired}}
      AND r.archive_attempts >= :max_attempts
    RETURNING r.id, r.archive_attempts, r.archive_error
),
vanished AS (
    -- The ledger: a slot an earlier attempt took is an upload Lsky may have counted (that
    -- attempt vanished: its lock expired), dated the latest it could have answered; a
    -- record failed here keeps no booking. So every slot this attempt settles is its own.
    UPDATE image_archive_uploads AS u
    SET state = 'done', at = LEAST(now(), u.at + interval '15 minutes')
    WHERE u.record_id = :record_id AND u.state = 'taken'
      AND (EXISTS (SELECT 1 FROM claimed) OR EXISTS (SELECT 1 FROM exhausted))
    RETURNING 1
),
vanished_unpaced AS (
    -- Unpaced, it took no slot: its upload enters the ledger all the same, dated as above
    -- from when its lock was taken.
    INSERT INTO image_archive_uploads (lane, at, record_id, state)
    SELECT 'lsky', LEAST(now(), target.archive_locked_at + interval '15 minutes'),
           target.id, 'done'
    FROM target
    WHERE target.archive_status = 'RUNNING' AND target.archive_locked_by IS DISTINCT FROM :owner
      AND (EXISTS (SELECT 1 FROM claimed) OR EXISTS (SELECT 1 FROM exhausted))
      AND NOT CAST(:paced AS boolean) AND NOT EXISTS (SELECT 1 FROM vanished)
    RETURNING 1
),
unbooked AS (
    DELETE FROM image_archive_uploads AS u
    USING exhausted AS x
    WHERE u.record_id = x.id AND u.state = 'booked'
    RETURNING 1
),
-- The completion event of a record `exhausted` failed (:publish: events are on).
failures AS (SELECT id, archive_attempts, archive_error FROM exhausted),
outboxed AS ({{outbox_failed}}),
-- The events this container published since its last claim (:published, with when) leave
-- the outbox, and their conclusions' story says so: no round trip of their own.
published AS ({{outbox_published}}),
told AS ({{note_publication}}),
-- The originals S3 answered for since this container's last claim (:confirmed_*: recorded
-- unconfirmed by a success write that did not wait) are confirmed: no round trip of their own.
confirmed AS ({{original_confirmed}}),
noted AS (
    -- The story (docs/explanation/stories.md): the message received, and the claim's own change. A
    -- re-run with the same owner (after a lost reply) writes nothing twice.
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT target.id, e.at, e.seq, e.attempt, e.kind, e.detail
    FROM target
    CROSS JOIN LATERAL (
        {{producer_enqueued}}
        UNION ALL
        SELECT now(), 1, target.archive_attempts, 'received',
               jsonb_build_object('message_id', CAST(:message_id AS text),
                                  'receive_count', CAST(:receive_count AS int))
               -- Why a message was not claimed (a claimed one's next event says it all).
               || CASE WHEN EXISTS (SELECT 1 FROM claimed) THEN '{}'
                       ELSE jsonb_build_object('claimed', false,
                                               'archive_status', target.archive_status,
                                               'lane_paused',
                                               EXISTS (SELECT 1 FROM lane
                                                       WHERE lane.paused_until > now()),
                                               'due_in_seconds', round(target.due_in)) END
        UNION ALL
        SELECT now(), 2, target.archive_attempts, 'lock_taken_over',
               jsonb_build_object('by', CAST(:owner AS text),
                                  'owner', target.archive_locked_by,
                                  'locked_at', target.archive_locked_at)
        WHERE target.archive_status = 'RUNNING'
          AND (EXISTS (SELECT 1 FROM claimed) OR EXISTS (SELECT 1 FROM exhausted))
        UNION ALL
        SELECT now(), 3, claimed.archive_attempts, 'claimed',
               jsonb_build_object('owner', CAST(:owner AS text))
               || CASE WHEN claimed.archive_staged_key IS NOT NULL
                       THEN jsonb_build_object('staged', true) ELSE '{}' END
        FROM claimed
        UNION ALL
        SELECT now(), 3, target.archive_attempts, 'failed',
               jsonb_build_object('by', 'archive function',
                                  'error', 'lock expired after the last attempt')
               || {{event_of_failure}}
        FROM exhausted
    ) AS e
    WHERE target.archive_locked_by IS DISTINCT FROM :owner
      -- A message for a record that is not live (archived, failed, never queued) is told
      -- in its story only while the story has a conclusion, which the retention removes
      -- it with: after the retention it would start a story of its own, never removed
      -- and read as a record just queued (docs/explanation/stories.md).
      AND (target.archive_status IN ('PENDING', 'RUNNING')
           OR EXISTS (SELECT 1 FROM image_archive_events AS told
                      WHERE told.record_id = target.id AND told.kind IN ('archived', 'failed')))
)
SELECT target.status, target.archive_status, target.lock_expired, target.due_in,
       exhausted.id IS NOT NULL,
       claimed.id, claimed.user_id, u.username, claimed.image_url,
       claimed.started_at, claimed.archive_attempts,
       target.may_be_hosted,
       lane.paused_for, lane.pause_reason, lane.pause_window, now(),
       lane.pause_detail, lane.paused_since, booking.queue_end,
       claimed.archive_staged_key, claimed.archive_staged_sha256, claimed.archive_staged_bytes,
       claimed.archive_first_claimed_at, booking.mine, claimed.archive_sent,
       outboxed.event_id, outboxed.detail_type, outboxed.detail, outboxed.created_at,
       -- A restore (image_archive_restores): the copy it replaces, and the original it
       -- publishes again (none: the source, which the auditor found unchanged).
       restore.record_id IS NOT NULL, restore.old_key,
       o.bucket, o.key, o.version_id, o.sha256, o.bytes, o.mime_type, o.source, o.confirmed,
       (SELECT count(*) FROM confirmed)
FROM (SELECT 1) AS one
LEFT JOIN lane ON true
LEFT JOIN booking ON true
LEFT JOIN target ON true
LEFT JOIN claimed ON true
LEFT JOIN exhausted ON true
LEFT JOIN outboxed ON true
LEFT JOIN users AS u ON u.id = claimed.user_id
LEFT JOIN image_archive_restores AS restore ON restore.record_id = claimed.id
LEFT JOIN image_archive_originals AS o ON o.record_id = restore.record_id;

-- name: succeed
-- Success wins whatever happened meanwhile (the lock passed on, or the sweeper failed
-- the row): the picture is hosted, so record it rather than upload it again. Returns
-- whether we still had the lock, whether this statement wrote the row, and whether
-- the row already has this very URL (a re-run after a lost reply).
-- The completion event (:event_id, NULL when none is published) goes into the outbox only
-- when this statement wrote the row, so a re-run after a lost reply writes none:
-- `Image Restored` when the row had another hosted URL (a restore published it again),
-- `Image Archived` otherwise (outbox_archived).
WITH before AS (
    SELECT id, archive_status, archive_locked_by, hosted_image_url,
           hosted_response ->> 'key' AS hosted_key
    FROM image_generation_records
    WHERE id = :record_id
    FOR UPDATE
),
written AS (
    UPDATE image_generation_records AS r
    SET archive_status = 'SUCCEEDED',
        archived_at = now(),
        hosted_image_url = :hosted_url,
        image_mime_type = :mime_type,
        hosted_response = CAST(:hosted_response AS jsonb),
        archive_altered = CAST(:altered AS boolean),
        archive_may_be_hosted = false,
        archive_error = NULL,
        archive_failed_at = NULL,
        archive_next_run_at = NULL,
        archive_locked_by = NULL,
        archive_locked_at = NULL,
        -- Published: the worker deletes the staged copy (if any) after this write.
        {{forget_staged}},
        archive_wait_reason = NULL,
        archive_sent = NULL
    FROM before
    WHERE r.id = before.id AND before.archive_status IN ('PENDING', 'RUNNING', 'FAILED')
    RETURNING r.id, r.archive_attempts
),
restored AS (
    -- A restore (image_archive_restores) is done once the new copy is recorded: the old
    -- URL and key go to the story, for an operator to delete on the host.
    DELETE FROM image_archive_restores AS x
    USING written
    WHERE x.record_id = written.id
    RETURNING x.old_url, x.old_key, x.reason
),
audited AS (
    -- The audit checks a newly hosted copy soon (the upload's own read back), then in
    -- rotation; a restored one no longer counts as lost.
    INSERT INTO image_archive_audits AS a (record_id, due_at)
    SELECT id, now() FROM written
    ON CONFLICT (record_id) DO UPDATE SET due_at = now(), lost = false
    RETURNING 1
),
outboxed AS ({{outbox_archived}}),
concluded AS (
    -- The ledger is settled whoever recorded the row, but only under our own lock: once
    -- it passed on, the record's rows are the new holder's (the takeover settled ours as
    -- an attempt that vanished). The upload happened (an adoption, :counted false, sent
    -- nothing: its slot, if it took one, is given back).
    SELECT id FROM before WHERE archive_locked_by IS NOT DISTINCT FROM :owner
),
{{settle_ledger}},
original AS (
    -- The original kept beside the upload (:original_key, none when nothing was kept),
    -- recorded with the success that points at that upload: no round trip of its own.
    -- :original_confirmed false: its body went out whole, S3's answer was not waited for.
    INSERT INTO image_archive_originals AS kept
        (record_id, bucket, key, version_id, sha256, bytes, mime_type, source, confirmed)
    SELECT written.id, CAST(:original_bucket AS text), CAST(:original_key AS text),
           CAST(:original_version_id AS text), CAST(:original_sha256 AS text),
           CAST(:original_bytes AS bigint), CAST(:original_mime_type AS text),
           CAST(:original_source AS text), CAST(:original_confirmed AS boolean)
    FROM written
    WHERE CAST(:original_key AS text) IS NOT NULL
    {{original_replaces}}
    RETURNING 1
),
noted AS (
    -- The attempt's events (:events), then its conclusion: whether it was recorded.
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT :record_id, e.at, e.seq, :attempt, e.kind, e.detail
    FROM ({{attempt_events}}
          UNION ALL
          SELECT now(), jsonb_array_length(CAST(:events AS jsonb)) + 1, 'archived',
                 -- Only what went otherwise than usual: not recorded (then no completion
                 -- event either), or after the lock passed.
                 (CAST(:detail AS jsonb) - CASE WHEN written.id IS NULL THEN 'event_id' ELSE '' END)
                 || CASE WHEN written.id IS NULL
                         THEN jsonb_build_object('recorded', false) ELSE '{}' END
                 || CASE WHEN before.archive_locked_by IS DISTINCT FROM :owner
                         THEN jsonb_build_object('under_lock', false) ELSE '{}' END
          FROM before LEFT JOIN written ON true
          UNION ALL
          SELECT now(), jsonb_array_length(CAST(:events AS jsonb)) + 2, 'restored',
                 jsonb_build_object('reason', restored.reason,
                                    'old_url', restored.old_url, 'old_key', restored.old_key,
                                    'new_url', CAST(:hosted_url AS text),
                                    'new_key', CAST(:hosted_response AS jsonb) ->> 'key')
          FROM restored) AS e
)
SELECT before.archive_locked_by IS NOT DISTINCT FROM :owner,
       written.id IS NOT NULL,
       before.hosted_image_url IS NOT DISTINCT FROM :hosted_url,
       outboxed.event_id, outboxed.detail_type, outboxed.detail, outboxed.created_at
FROM before
LEFT JOIN written ON true
LEFT JOIN outboxed ON true;

-- name: retry
-- :may_be_hosted: whether this attempt may have left an image on Lsky (an upload whose
-- answer never came); the next attempt looks it up first when it did.
-- :staged_key: a copy staged during this attempt (NULL keeps the row's own).
-- The ledger: settle_ledger (:counted, :keep_booking; as for every conclusion).
WITH concluded AS (
    UPDATE image_generation_records
    SET archive_status = 'PENDING',
        archive_error = :error,
        archive_may_be_hosted = :may_be_hosted,
        archive_next_run_at = now() + make_interval(secs => :delay),
        archive_wait_reason = 'backoff',
        {{record_sent}},
        archive_locked_by = NULL,
        archive_locked_at = NULL,
        {{record_staged}}
    WHERE id = :record_id AND archive_locked_by = :owner AND archive_status = 'RUNNING'
    RETURNING id, archive_next_run_at
),
{{settle_ledger}},
noted AS ({{note_conclusion}})
SELECT id FROM concluded;

-- name: fail
-- :may_be_hosted as in retry: a FAILED row can be requeued by an operator.
-- :keep_staged keeps (or records :staged_key as) the staged copy, for a replay by
-- `archive-ctl requeue --failed` after a failure that was not the image's own.
-- The ledger: settle_ledger (:counted, :keep_booking; as for every conclusion).
WITH concluded AS (
    UPDATE image_generation_records
    SET archive_status = 'FAILED',
        archive_error = :error,
        archive_failed_at = now(),
        archive_may_be_hosted = :may_be_hosted,
        archive_next_run_at = NULL,
        archive_locked_by = NULL,
        archive_locked_at = NULL,
        archive_wait_reason = NULL,
        {{record_sent}},
        archive_staged_key = CASE WHEN CAST(:keep_staged AS boolean)
                                  THEN COALESCE(CAST(:staged_key AS text), archive_staged_key) END,
        archive_staged_at = CASE WHEN NOT CAST(:keep_staged AS boolean) THEN NULL
                                 WHEN CAST(:staged_key AS text) IS NOT NULL THEN now()
                                 ELSE archive_staged_at END,
        archive_staged_sha256 = CASE WHEN NOT CAST(:keep_staged AS boolean) THEN NULL
                                     WHEN CAST(:staged_key AS text) IS NOT NULL
                                          THEN CAST(:staged_sha256 AS text)
                                     ELSE archive_staged_sha256 END,
        archive_staged_bytes = CASE WHEN NOT CAST(:keep_staged AS boolean) THEN NULL
                                    WHEN CAST(:staged_key AS text) IS NOT NULL
                                         THEN CAST(:staged_bytes AS bigint)
                                    ELSE archive_staged_bytes END
    WHERE id = :record_id AND archive_locked_by = :owner AND archive_status = 'RUNNING'
    RETURNING id, archive_next_run_at, archive_attempts, archive_error
),
{{settle_ledger}},
-- The completion event (:event_id; NULL: none published), only when the row was ours.
failures AS (SELECT id, archive_attempts, archive_error FROM concluded),
outboxed AS ({{outbox_failed}}),
noted AS ({{note_conclusion}})
SELECT concluded.id, outboxed.event_id, outboxed.detail_type, outboxed.detail,
       outboxed.created_at
FROM concluded
LEFT JOIN outboxed ON true;

-- name: release
-- Give the row back without spending the attempt: nothing was fetched yet, or our own
-- fault (configuration, a bug) stopped it. :error, when given, says which;
-- :may_be_hosted is what the claim found, or true when our fault may have cut an upload.
-- The ledger: settle_ledger (:counted, :keep_booking; as for every conclusion).
-- :kind (held or parked) is the event it writes.
WITH concluded AS (
    UPDATE image_generation_records
    SET archive_status = 'PENDING',
        archive_attempts = GREATEST(archive_attempts - 1, 0),
        archive_error = COALESCE(CAST(:error AS text), archive_error),
        -- Parked (no message left for it): the sweeper sends it once due.
        archive_enqueued_at = CASE WHEN CAST(:park AS boolean) THEN NULL
                                   ELSE archive_enqueued_at END,
        archive_may_be_hosted = :may_be_hosted,
        archive_next_run_at = now() + make_interval(secs => :delay),
        archive_wait_reason = :wait_reason,
        {{record_sent}},
        archive_locked_by = NULL,
        archive_locked_at = NULL,
        {{record_staged}}
    WHERE id = :record_id AND archive_locked_by = :owner AND archive_status = 'RUNNING'
    RETURNING id, archive_next_run_at
),
{{settle_ledger}},
noted AS ({{note_conclusion}})
SELECT id FROM concluded;

-- name: recover_picked
-- The body shared by the two expired-lock sweeps. The attempt was spent when the claim
-- counted it: the row becomes FAILED (none left) or PENDING and is sent again at once.
-- archive_next_run_at is kept: already past due, so a failed send leaves it eligible.
UPDATE image_generation_records AS r
SET archive_status = CASE WHEN r.archive_attempts >= :max_attempts
                          THEN 'FAILED' ELSE 'PENDING' END,
    archive_error = CASE WHEN r.archive_attempts >= :max_attempts
                         THEN 'lock expired after the last attempt'
                         ELSE format('lock expired during attempt %s/%s; sent again',
                                     r.archive_attempts, CAST(:max_attempts AS int)) END,
    archive_failed_at = CASE WHEN r.archive_attempts >= :max_attempts THEN now() END,
    archive_next_run_at = CASE WHEN r.archive_attempts >= :max_attempts
                               THEN NULL ELSE r.archive_next_run_at END,
    archive_enqueued_at = CASE WHEN r.archive_attempts >= :max_attempts
                               THEN r.archive_enqueued_at ELSE now() END,
    archive_locked_by = NULL,
    archive_locked_at = NULL
FROM picked
WHERE r.id = picked.id
RETURNING r.id, r.archive_status, picked.archive_enqueued_at AS previous_enqueued_at,
          r.archive_enqueued_at, r.archive_next_run_at, r.archive_backfilled,
          r.archive_attempts, r.archive_error, picked.archive_locked_by AS locked_by,
          picked.archive_locked_at AS locked_at

-- name: note_recovered
-- The story of rows taken over from an expired lock (`swept`): the lock taken over by
-- the sweeper, then sent again or FAILED.
INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
SELECT target.id, e.at, e.seq, e.attempt, e.kind, e.detail
FROM (SELECT *, previous_enqueued_at AS enqueued_at, archive_next_run_at AS next_run_at
      FROM swept) AS target
CROSS JOIN LATERAL (
    {{producer_enqueued}}
    UNION ALL
    SELECT now(), 1, target.archive_attempts, 'lock_taken_over',
           jsonb_build_object('by', 'sweeper', 'owner', target.locked_by,
                              'locked_at', target.locked_at)
    UNION ALL
    SELECT now(), 2, target.archive_attempts,
           CASE WHEN target.archive_status = 'FAILED' THEN 'failed' ELSE 'enqueued' END,
           CASE WHEN target.archive_status = 'FAILED'
                THEN jsonb_build_object('by', 'sweeper', 'error', target.archive_error)
                     || {{event_of_failure}}
                ELSE jsonb_build_object('by', 'sweeper', 'why', 'lock expired') END
) AS e

-- name: recover_expired_locks
-- Two statements rather than an OR with IS NULL, which would turn the index range scan
-- into a scan of the whole index.
WITH picked AS (
    SELECT id, archive_enqueued_at, archive_locked_by, archive_locked_at
    FROM image_generation_records
    WHERE archive_status = 'RUNNING' AND {{lock_time_expired}}
    ORDER BY archive_locked_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
swept AS ({{recover_picked}}),
{{outbox_swept}},
-- The attempt vanished: its slot is an upload Lsky may have counted, its booking goes.
concluded AS (SELECT id FROM swept),
{{settle_ledger}},
noted AS ({{note_recovered}})
{{swept_rows}};

-- name: recover_lockless
WITH picked AS (
    SELECT id, archive_enqueued_at, archive_locked_by, archive_locked_at
    FROM image_generation_records
    WHERE archive_status = 'RUNNING' AND archive_locked_at IS NULL
    ORDER BY archive_locked_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
swept AS ({{recover_picked}}),
{{outbox_swept}},
-- The attempt vanished: its slot is an upload Lsky may have counted, its booking goes.
concluded AS (SELECT id FROM swept),
{{settle_ledger}},
noted AS ({{note_recovered}})
{{swept_rows}};

-- name: date_undated
-- A PENDING row without a due time would never match take_lost: due now, so the grace
-- period starts when the sweeper first sees it.
WITH picked AS (
    SELECT id, archive_enqueued_at
    FROM image_generation_records
    WHERE archive_status = 'PENDING' AND archive_next_run_at IS NULL
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
dated AS (
    UPDATE image_generation_records AS r
    SET archive_next_run_at = now()
    FROM picked
    WHERE r.id = picked.id
    RETURNING r.id, r.archive_status, r.archive_attempts,
              picked.archive_enqueued_at AS enqueued_at, r.archive_next_run_at AS next_run_at
),
noted AS (
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT target.id, e.at, e.seq, e.attempt, e.kind, e.detail
    FROM dated AS target
    CROSS JOIN LATERAL (
        {{producer_enqueued}}
        UNION ALL
        SELECT now(), 1, target.archive_attempts, 'dated', jsonb_build_object('by', 'sweeper')
    ) AS e
)
SELECT id FROM dated;

-- name: lost_row
-- A lost message (lib.archive.sweep_rules.is_lost): due more than the grace period ago,
-- and either never sent (no stamp) or its message entered the queue (its last send, or
-- the end of the hold the worker set: the due time) before :lost_before, the time the
-- sweep's view of the queue says a message must be older than to be lost
-- (sweep_rules.lost_before). A range of the PENDING partial index, keyset-paged on the
-- due time (:after).
archive_status = 'PENDING'
AND archive_next_run_at >= CAST(:after AS timestamptz)
AND archive_next_run_at < now() - make_interval(secs => :grace)
AND (archive_enqueued_at IS NULL
     OR (archive_enqueued_at < CAST(:lost_before AS timestamptz)
         AND archive_next_run_at < CAST(:lost_before AS timestamptz)))

-- name: parked_row
-- A row we parked (no message out, a wait reason), due within the grace period (older
-- ones are lost rows too): a range of the parked partial index.
archive_status = 'PENDING' AND archive_enqueued_at IS NULL
AND archive_wait_reason IS NOT NULL
AND archive_next_run_at >= GREATEST(CAST(:after AS timestamptz),
                                    now() - make_interval(secs => :grace))
AND archive_next_run_at < now()

-- name: take_picked
-- The body shared by take_lost and take_lost_backfilled: the picked rows are stamped and
-- sent. A row whose generation is not SUCCEEDED can never be claimed: it is concluded as
-- FAILED instead of sent forever.
UPDATE image_generation_records AS r
SET archive_status = CASE WHEN r.status = 'SUCCEEDED' THEN 'PENDING' ELSE 'FAILED' END,
    archive_error = CASE WHEN r.status = 'SUCCEEDED' THEN r.archive_error
                         ELSE format('generation status is %s; nothing to archive', r.status)
                    END,
    archive_failed_at = CASE WHEN r.status = 'SUCCEEDED' THEN NULL ELSE now() END,
    archive_next_run_at = CASE WHEN r.status = 'SUCCEEDED' THEN r.archive_next_run_at END,
    archive_enqueued_at = CASE WHEN r.status = 'SUCCEEDED'
                               THEN now() ELSE r.archive_enqueued_at END
FROM picked
WHERE r.id = picked.id
RETURNING r.id, r.archive_status, picked.archive_enqueued_at AS previous_enqueued_at,
          r.archive_enqueued_at, r.archive_next_run_at, r.archive_backfilled,
          r.archive_attempts, r.archive_error, r.archive_wait_reason

-- name: note_taken
-- The story of the rows take_picked sent (`swept`): enqueued by the sweeper, lost (its
-- message was) or parked (it had none), or FAILED when its generation did not succeed.
INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
SELECT target.id, e.at, e.seq, e.attempt, e.kind, e.detail
FROM (SELECT *, previous_enqueued_at AS enqueued_at, archive_next_run_at AS next_run_at
      FROM swept) AS target
CROSS JOIN LATERAL (
    {{producer_enqueued}}
    UNION ALL
    SELECT now(), 1, target.archive_attempts,
           CASE WHEN target.archive_status = 'FAILED' THEN 'failed' ELSE 'enqueued' END,
           CASE WHEN target.archive_status = 'FAILED'
                THEN jsonb_build_object('by', 'sweeper', 'error', target.archive_error)
                     || {{event_of_failure}}
                WHEN target.previous_enqueued_at IS NULL
                     AND target.archive_wait_reason IS NOT NULL
                THEN jsonb_build_object('by', 'sweeper', 'why', 'parked',
                                        'wait_reason', target.archive_wait_reason)
                ELSE jsonb_build_object('by', 'sweeper', 'why', 'lost',
                                        'last_sent', target.previous_enqueued_at) END
) AS e

-- name: outbox_swept
-- The completion events of the rows a sweeper statement failed (`swept`).
failures AS (SELECT id, archive_attempts, archive_error FROM swept
             WHERE archive_status = 'FAILED'),
outboxed AS ({{outbox_failed}})

-- name: swept_rows
-- What a sweeper statement returns of its rows (lib.state.sweeps.SweptRow), with the
-- completion event of a row it failed.
SELECT swept.id, swept.archive_status, swept.previous_enqueued_at, swept.archive_enqueued_at,
       swept.archive_next_run_at, swept.archive_backfilled, outboxed.event_id
FROM swept
LEFT JOIN outboxed ON outboxed.record_id = swept.id

-- name: take_lost
-- Live rows' lost messages, then rows we parked as soon as they are due: two range reads,
-- of the PENDING and the parked partial indexes (a backfilled row in the range is passed
-- over: take_lost_backfilled sends those, after the live ones).
WITH lost AS (
    SELECT id, archive_enqueued_at
    FROM image_generation_records
    WHERE {{lost_row}} AND NOT archive_backfilled
    ORDER BY archive_next_run_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
parked AS (
    SELECT id, archive_enqueued_at
    FROM image_generation_records
    WHERE {{parked_row}} AND NOT archive_backfilled
    ORDER BY archive_next_run_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
picked AS (
    SELECT * FROM lost UNION ALL SELECT * FROM parked LIMIT :limit
),
swept AS ({{take_picked}}),
{{outbox_swept}},
noted AS ({{note_taken}})
{{swept_rows}};

-- name: take_lost_backfilled
-- The same for rows a backfill queued (archive_backfilled), which the sweeper sends after
-- the live ones: range reads of their own partial index only.
WITH lost AS (
    SELECT id, archive_enqueued_at
    FROM image_generation_records
    WHERE {{lost_row}} AND archive_backfilled
    ORDER BY archive_next_run_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
parked AS (
    SELECT id, archive_enqueued_at
    FROM image_generation_records
    WHERE {{parked_row}} AND archive_backfilled
    ORDER BY archive_next_run_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
picked AS (
    SELECT * FROM lost UNION ALL SELECT * FROM parked LIMIT :limit
),
swept AS ({{take_picked}}),
{{outbox_swept}},
noted AS ({{note_taken}})
{{swept_rows}};

-- name: queue_mark
-- The queue's receive mark (the claim moves it) and the database's clock, for the sweep's
-- view of the queue: one row even without the mark's row.
SELECT (SELECT received_through FROM image_archive_queue WHERE queue = 'archive'), now();

-- name: restore_stamps
-- Put back the stamps of rows whose send failed, only where the stamp is still ours.
WITH restored AS (
    UPDATE image_generation_records AS r
    SET archive_enqueued_at = v.previous
    FROM unnest(CAST(:ids AS bigint[]), CAST(:previous AS timestamptz[])) AS v(id, previous)
    WHERE r.id = v.id AND r.archive_enqueued_at = CAST(:stamp AS timestamptz)
    RETURNING r.id, r.archive_attempts
),
noted AS (
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT id, now(), 2, archive_attempts, 'unsent', jsonb_build_object('by', 'sweeper')
    FROM restored
)
SELECT id FROM restored;

-- name: oldest_pending_age
-- How long the oldest PENDING row has been due (0 when none is): one index entry.
SELECT CAST(COALESCE(GREATEST(EXTRACT(EPOCH FROM now() - min(archive_next_run_at)), 0), 0)
            AS double precision)
FROM image_generation_records
WHERE archive_status = 'PENDING';

-- name: mark_for_enqueue
-- The producer's first step: rows that can take a message become PENDING, due now and
-- stamped; the outer SELECT (one snapshot, before the UPDATE) explains every skip.
WITH wanted AS (
    SELECT DISTINCT unnest(CAST(:ids AS bigint[])) AS id
),
marked AS (
    UPDATE image_generation_records AS r
    SET archive_status = 'PENDING',
        archive_next_run_at = now(),
        archive_enqueued_at = now()
    FROM wanted
    WHERE r.id = wanted.id
      AND r.status = 'SUCCEEDED'
      AND (r.archive_status IS NULL OR r.archive_status = 'PENDING')
    RETURNING r.id, r.archive_enqueued_at, r.archive_attempts
),
noted AS (
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT id, now(), 0, archive_attempts, 'enqueued', jsonb_build_object('by', CAST(:by AS text))
    FROM marked
)
SELECT wanted.id, r.id IS NOT NULL, r.status, r.archive_status, marked.archive_enqueued_at
FROM wanted
LEFT JOIN image_generation_records AS r ON r.id = wanted.id
LEFT JOIN marked ON marked.id = wanted.id
ORDER BY wanted.id;

-- name: unstamp
-- A row whose send failed loses our stamp, so the sweeper sends it after its grace
-- period instead of a whole requeue interval later.
WITH unstamped AS (
    UPDATE image_generation_records
    SET archive_enqueued_at = NULL
    WHERE id = ANY(CAST(:ids AS bigint[]))
      AND archive_status = 'PENDING'
      AND archive_enqueued_at = CAST(:stamp AS timestamptz)
    RETURNING id, archive_attempts
)
INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
SELECT id, now(), 1, archive_attempts, 'unsent',
       jsonb_build_object('by', CAST(:by AS text), 'error', CAST(:error AS text))
FROM unstamped;

-- name: failed_time
-- When a FAILED row failed: archive_failed_at, which every statement that fails a row sets.
-- A row an older release failed has none: then the latest time known before its failure
-- (its last send, its first claim, its generation), never later than the real one.
-- archive_migration.sql's failed_at index is on this very text: change both or neither.
COALESCE(archive_failed_at,
         GREATEST(archive_enqueued_at, archive_first_claimed_at, started_at))

-- name: record_selection
-- The filters `archive-ctl list` and `requeue` share (lib.state.selection); a NULL
-- parameter filters nothing. :error is an ILIKE pattern, :error_patterns the LIKE
-- prefixes of an error class, :waiting the wait reason of a PENDING row not due yet.
(CAST(:ids AS bigint[]) IS NULL OR id = ANY(CAST(:ids AS bigint[])))
AND id >= CAST(:id_from AS bigint) AND id <= CAST(:id_to AS bigint)
AND (CAST(:error AS text) IS NULL OR archive_error ILIKE CAST(:error AS text))
AND (CAST(:error_patterns AS text[]) IS NULL
     OR archive_error LIKE ANY(CAST(:error_patterns AS text[])))
AND (CAST(:waiting AS text) IS NULL
     OR (archive_status = 'PENDING' AND archive_next_run_at > now()
         AND COALESCE(archive_wait_reason, 'unknown') = CAST(:waiting AS text)))
-- :audit, what the audit last found (missing, altered; lost: either, nothing to restore
-- from): its partial index has only such rows.
AND (CAST(:audit AS text) IS NULL
     OR id IN (SELECT a.record_id FROM image_archive_audits AS a
               WHERE a.verdict <> 'intact'
                 AND (a.verdict = CAST(:audit AS text)
                      OR (CAST(:audit AS text) = 'lost' AND a.lost))))

-- name: failed_selection
-- FAILED rows the selection names that failed in [:since, :until); :requeuable keeps only
-- those of a SUCCEEDED generation (the only ones a requeue can give new attempts).
archive_status = 'FAILED'
AND {{failed_time}} >= CAST(:since AS timestamptz)
AND {{failed_time}} < CAST(:until AS timestamptz)
AND (NOT CAST(:requeuable AS boolean) OR status = 'SUCCEEDED')
AND {{record_selection}}

-- name: listed_record
-- A record as `archive-ctl list` shows it (lib.state.selection.ListedRecord).
id, status, archive_status, archive_attempts, archive_wait_reason,
archive_enqueued_at IS NULL, archive_next_run_at, archive_locked_at, archive_error,
archived_at, hosted_image_url, started_at,
CASE WHEN archive_status = 'FAILED' THEN {{failed_time}} END,
archive_status = 'FAILED' AND archive_failed_at IS NULL,
(SELECT a.verdict || CASE WHEN a.lost THEN ' (lost)' ELSE '' END
 FROM image_archive_audits AS a
 WHERE a.record_id = id AND a.verdict <> 'intact'),
hosted_response ->> 'key'

-- name: list_failed
-- FAILED rows, newest failure first, keyset-paged below (:after_time, :after_id): a range
-- of the failed_at index read backwards, however many rows the table has.
SELECT {{listed_record}}
FROM image_generation_records
WHERE {{failed_selection}}
  AND ({{failed_time}}, id) < (CAST(:after_time AS timestamptz), CAST(:after_id AS bigint))
ORDER BY {{failed_time}} DESC, id DESC
LIMIT :limit;

-- name: count_failed
-- How many rows list_failed would list over every page (the same index range).
SELECT count(*) FROM image_generation_records WHERE {{failed_selection}};

-- name: list_records
-- Records in any state (:state NULL) or one (a state name; 'none': never queued), newest
-- record first, keyset-paged below :after_id. No state: the primary key read backwards;
-- PENDING or RUNNING: their partial index (the rows of that state, then sorted).
-- :with_error (an error filter): only the states that keep an error (a success clears
-- it), written as an OR so that the three partial indexes serve it, not the table.
SELECT {{listed_record}}
FROM image_generation_records
WHERE id < CAST(:after_id AS bigint)
  AND (CAST(:state AS text) IS NULL
       OR archive_status = CAST(:state AS text)
       OR (CAST(:state AS text) = 'none' AND archive_status IS NULL))
  AND (NOT CAST(:with_error AS boolean)
       OR archive_status = 'PENDING' OR archive_status = 'RUNNING'
       OR archive_status = 'FAILED')
  AND {{record_selection}}
ORDER BY id DESC
LIMIT :limit;

-- name: record_states
-- What each id asked for is, for the ones a requeue did not take.
SELECT wanted.id, r.id IS NOT NULL, r.status, r.archive_status
FROM unnest(CAST(:ids AS bigint[])) AS wanted (id)
LEFT JOIN image_generation_records AS r ON r.id = wanted.id
ORDER BY wanted.id;

-- name: requeue_failed
-- A fresh attempt budget for the FAILED rows the selection names, in list_failed's order
-- (what `list --state FAILED` shows is what is taken); the last error is kept until the next attempt,
-- the failure time cleared.
WITH picked AS (
    SELECT id, archive_attempts, archive_error
    FROM image_generation_records
    WHERE {{failed_selection}}
    ORDER BY {{failed_time}} DESC, id DESC
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
requeued AS (
    UPDATE image_generation_records AS r
    SET archive_status = 'PENDING',
        archive_attempts = 0,
        archive_failed_at = NULL,
        archive_next_run_at = now(),
        archive_enqueued_at = now(),
        archive_locked_by = NULL,
        archive_locked_at = NULL
    FROM picked
    WHERE r.id = picked.id
    RETURNING r.id, r.archive_enqueued_at, picked.archive_attempts, picked.archive_error
),
noted AS (
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT id, now(), 0, 0, 'enqueued',
           jsonb_build_object('by', 'archive-ctl requeue', 'was', 'FAILED',
                              'attempts', archive_attempts, 'error', archive_error)
    FROM requeued
)
SELECT id, archive_enqueued_at FROM requeued;

-- name: live_counts
-- `archive-ctl status`: reads only the partial indexes (PENDING, RUNNING, FAILED). The
-- oldest due row's age is NULL when no row is due (none to tell, not "0 s").
SELECT
    (SELECT count(*) FROM image_generation_records WHERE archive_status = 'PENDING'),
    (SELECT count(*) FROM image_generation_records
      WHERE archive_status = 'PENDING'
        AND (archive_next_run_at IS NULL OR archive_next_run_at <= now())),
    (SELECT CAST(EXTRACT(EPOCH FROM now() - min(archive_next_run_at)) AS double precision)
       FROM image_generation_records
      WHERE archive_status = 'PENDING' AND archive_next_run_at <= now()),
    (SELECT count(*) FROM image_generation_records WHERE archive_status = 'RUNNING'),
    (SELECT count(*) FROM image_generation_records
      WHERE archive_status = 'RUNNING' AND {{lock_expired}}),
    (SELECT count(*) FROM image_generation_records WHERE archive_status = 'FAILED'),
    (SELECT count(*) FROM image_generation_records
      WHERE archive_status = 'FAILED' AND {{failed_time}} >= now() - interval '24 hours');

-- name: waiting_counts
-- `archive-ctl status`: PENDING rows not due yet, by why they wait and whether a message
-- is out for them (held) or not (parked). A range read of the PENDING index.
SELECT COALESCE(archive_wait_reason, 'unknown'), archive_enqueued_at IS NULL, count(*)
FROM image_generation_records
WHERE archive_status = 'PENDING' AND archive_next_run_at > now()
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: all_counts
-- Every state, SUCCEEDED and never queued included: a full scan, so only on request.
SELECT COALESCE(archive_status, 'not queued'), count(*)
FROM image_generation_records
GROUP BY 1
ORDER BY 1;

-- name: park
-- A PENDING row that waits without having been claimed. Parked: the paused lane will not
-- take it for a long while, its message is acknowledged, and the sweeper's lost-message
-- step sends a new one once the row is due and the lane open (no stamp: no message is out
-- for it). :held: its message is kept, hidden until the row is due, so the due time says
-- when it comes back (the sweeper's lost-message rule reads it as the message's entry).
-- A booking it had goes (settle_ledger): it comes back for no booked slot.
WITH parked AS (
    UPDATE image_generation_records
    SET archive_next_run_at = GREATEST(archive_next_run_at,
                                       now() + make_interval(secs => :delay)),
        archive_wait_reason = COALESCE(CAST(:wait_reason AS text), archive_wait_reason),
        archive_enqueued_at = CASE WHEN CAST(:held AS boolean) THEN archive_enqueued_at END
    WHERE id = :record_id AND archive_status = 'PENDING'
    RETURNING id, archive_attempts, archive_next_run_at, archive_wait_reason
),
concluded AS (SELECT id FROM parked),
{{settle_ledger}},
noted AS (
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT id, now(), 0, archive_attempts,
           CASE WHEN CAST(:held AS boolean) THEN 'held' ELSE 'parked' END,
           CAST(:detail AS jsonb) || jsonb_build_object('why', archive_wait_reason,
                                                        'until', archive_next_run_at)
    FROM parked
)
SELECT id FROM parked;

-- name: lane_paused_for
-- Seconds left of the lane's pause (NULL: open; negative: over). PostgreSQL before 17
-- refuses to subtract an infinite timestamp: a pause until cleared is +Infinity.
CASE WHEN isfinite(paused_until)
          THEN CAST(EXTRACT(EPOCH FROM paused_until - now()) AS double precision)
     WHEN paused_until > now() THEN CAST('Infinity' AS double precision)
     WHEN paused_until IS NOT NULL THEN CAST('-Infinity' AS double precision) END

-- name: lane_state
-- The lane as one row (the claim reads the same first columns); a pause until cleared
-- has a NULL end time here. Booked: slots pacing handed out and not yet used.
SELECT {{lane_paused_for}},
       pause_reason, pause_window, now(), pause_detail, paused_since,
       (SELECT max(at) FROM image_archive_uploads WHERE state = 'booked'),
       CASE WHEN isfinite(paused_until) THEN paused_until END,
       (SELECT count(*) FROM image_archive_uploads WHERE state = 'booked'),
       (SELECT count(*) FROM image_archive_uploads
         WHERE state <> 'booked' AND at > now() - make_interval(secs => :drain_seconds)
           AND at <= now())
FROM image_archive_lane
WHERE lane = 'lsky';

-- name: pause_lane
-- Close the lane until :until (infinity: until cleared). A longer pause already in
-- force is kept; the first cause of a pause is remembered as its start.
UPDATE image_archive_lane
SET paused_until = GREATEST(COALESCE(paused_until, '-infinity'), CAST(:until AS timestamptz)),
    pause_reason = CASE WHEN paused_until > CAST(:until AS timestamptz) THEN pause_reason
                        ELSE :reason END,
    pause_window = CASE WHEN paused_until > CAST(:until AS timestamptz) THEN pause_window
                        ELSE :window END,
    pause_detail = CASE WHEN paused_until > CAST(:until AS timestamptz) THEN pause_detail
                        ELSE :detail END,
    paused_since = CASE WHEN paused_until > now() THEN paused_since ELSE now() END,
    version = version + 1
WHERE lane = 'lsky'
RETURNING paused_until;

-- name: clear_pause
-- Open the lane (an operator, or the sweeper's probe found the account healthy).
-- :reason limits it to pauses of that reason; NULL clears any.
UPDATE image_archive_lane AS l
SET paused_until = NULL, pause_reason = NULL, pause_window = NULL, pause_detail = NULL,
    paused_since = NULL, version = l.version + 1
FROM (SELECT lane, pause_reason FROM image_archive_lane WHERE lane = 'lsky' FOR UPDATE) AS old
WHERE l.lane = old.lane AND l.paused_until IS NOT NULL
  AND (CAST(:reason AS text) IS NULL OR old.pause_reason = :reason)
RETURNING old.pause_reason;

-- name: ledger_entries
-- Every upload the lane knows of (done: dated when Lsky answered; taken: under way, dated
-- when it started) and every booked slot, as (at, n, state): the ledger's rows one by
-- one, older hours rolled up (counted at the hour's end, which can only make a window look
-- fuller than it was). :record_id's own booking is left out.
SELECT at, 1 AS n, state FROM image_archive_uploads
 WHERE lane = 'lsky'
   AND NOT (state = 'booked' AND record_id IS NOT DISTINCT FROM CAST(:record_id AS bigint))
UNION ALL
SELECT hour + interval '1 hour', uploads, 'done' FROM image_archive_upload_hours
 WHERE lane = 'lsky'

-- name: slot_ledger
-- Pacing's read (lib.ratelimit.slots decides on it): the lane's pause and version (the write
-- is made only if no slot or pause came since), the database's clock, :record_id's booking
-- and whether the record is a backfill's, and every entry a window of :seconds can meet
-- but the record's own slot (booked, or taken by an upload Lsky just refused): uploads done
-- or under way as far back as the window reaches (an upload under way counts until it
-- answers, 15 minutes at most), every other booked slot, and the
-- hours rolled up, counted at the hour's end (which can only make a window look fuller than
-- it was), live and backfilled apart. One row, one round trip; the entries as one text
-- (`epoch n state history record;...`: a driver parses arrays of hundreds slowly).
WITH entries AS (
    SELECT u.at, 1 AS n, u.state, COALESCE(r.archive_backfilled, false) AS history,
           u.record_id
    FROM image_archive_uploads AS u
    LEFT JOIN image_generation_records AS r ON r.id = u.record_id
    WHERE u.lane = 'lsky'
      AND (u.state = 'booked' OR u.at > now() - make_interval(secs => CAST(:seconds AS double precision) + 905))
      AND NOT (u.state <> 'done' AND u.record_id IS NOT DISTINCT FROM CAST(:record_id AS bigint))
    UNION ALL
    SELECT h.hour + interval '1 hour', part.n, 'done', part.history, NULL
    FROM image_archive_upload_hours AS h
    CROSS JOIN LATERAL (VALUES (h.uploads - h.backfill_uploads, false),
                               (h.backfill_uploads, true)) AS part (n, history)
    WHERE h.lane = 'lsky' AND part.n > 0
      AND h.hour + interval '1 hour' > now() - make_interval(secs => CAST(:seconds AS double precision) + 5)
)
SELECT COALESCE(l.paused_until > now(), false),
       CASE WHEN isfinite(l.paused_until) THEN l.paused_until END,
       l.version, now(), CAST(EXTRACT(EPOCH FROM now()) AS double precision),
       (SELECT CAST(EXTRACT(EPOCH FROM max(b.at)) AS double precision)
        FROM image_archive_uploads AS b
        WHERE b.record_id = CAST(:record_id AS bigint) AND b.state = 'booked'),
       COALESCE((SELECT archive_backfilled FROM image_generation_records
                 WHERE id = CAST(:record_id AS bigint)), false),
       COALESCE(string_agg(concat_ws(' ', EXTRACT(EPOCH FROM e.at), e.n, e.state,
                                     CASE WHEN e.history THEN 1 ELSE 0 END,
                                     COALESCE(e.record_id, 0)), ';')
                FILTER (WHERE e.at IS NOT NULL), '')
FROM image_archive_lane AS l
LEFT JOIN entries AS e ON true
WHERE l.lane = 'lsky'
GROUP BY l.paused_until, l.version;

-- name: take_slot
-- Pacing's write: the slot lib.ratelimit.slots decided on slot_ledger's read, only if the
-- lane's version is still :version (no other slot and no pause came since: every slot and
-- every pause bumps it; otherwise nothing is written and the caller reads again). The
-- record's booking is replaced by :state at :at (taken: the upload starts; booked; NULL:
-- none kept), and the bookings of backfilled records this live record's slot takes over
-- (:displaced) are dropped: they book again when they come back.
WITH bumped AS (
    UPDATE image_archive_lane SET version = version + 1
    WHERE lane = 'lsky' AND version = :version
    RETURNING 1
),
cleared AS (
    DELETE FROM image_archive_uploads
    WHERE state = 'booked' AND EXISTS (SELECT 1 FROM bumped)
      AND (record_id = :record_id OR record_id = ANY(CAST(:displaced AS bigint[])))
    RETURNING 1
),
written AS (
    INSERT INTO image_archive_uploads (lane, at, record_id, state)
    SELECT 'lsky', to_timestamp(:at), :record_id, CAST(:state AS text)
    WHERE CAST(:state AS text) IS NOT NULL AND EXISTS (SELECT 1 FROM bumped)
    RETURNING at
)
SELECT EXISTS (SELECT 1 FROM bumped), (SELECT at FROM written);

-- name: settle_ledger
-- The ledger's side of every statement that concludes an attempt (succeed, retry, fail,
-- release, park) and of the sweeper's recovery: the record's rows end with the attempt.
-- Written once, used as CTEs after the statement's own `concluded` (the rows it changed,
-- `id`), so nothing is settled when the lock had passed on (the new holder's rows are its
-- own). The upload this attempt's slot took stays when Lsky may have counted it
-- (:counted), dated when that was known: now, or for an attempt that vanished
-- (:vanished) the latest it could have answered; any other slot is given back. A booking
-- stays only when the attempt comes back for it (:keep_booking). Unpaced (:paced false),
-- no slot was taken: an upload Lsky may have counted enters the ledger here, dated now.
ledger_counted AS (
    UPDATE image_archive_uploads AS u
    SET state = 'done',
        at = CASE WHEN CAST(:vanished AS boolean)
                  THEN LEAST(now(), u.at + interval '15 minutes')
                  ELSE GREATEST(u.at, now()) END
    FROM concluded AS w
    WHERE u.record_id = w.id AND u.state = 'taken' AND CAST(:counted AS boolean)
    RETURNING u.record_id
),
ledger_logged AS (
    INSERT INTO image_archive_uploads (lane, at, record_id, state)
    SELECT 'lsky', now(), w.id, 'done'
    FROM concluded AS w
    WHERE CAST(:counted AS boolean) AND NOT CAST(:paced AS boolean)
      AND NOT EXISTS (SELECT 1 FROM ledger_counted AS c WHERE c.record_id = w.id)
    RETURNING 1
),
ledger_freed AS (
    DELETE FROM image_archive_uploads AS u
    USING concluded AS w
    WHERE u.record_id = w.id
      AND ((u.state = 'taken' AND NOT CAST(:counted AS boolean))
           OR (u.state = 'booked' AND NOT CAST(:keep_booking AS boolean)))
    RETURNING 1
)

-- name: uploads_within
-- Uploads (done or under way) in the last :seconds: the drain rate, status, backfill.
SELECT COALESCE(sum(n), 0) FROM ({{ledger_entries}}) AS e
WHERE at > now() - make_interval(secs => :seconds) AND at <= now();

-- name: lane_ledger
-- `archive-ctl status` and `backfill` with pacing on: the ledger's entries of the last
-- :seconds and its booked slots, as (seconds from now: negative done or under way, positive
-- booked; uploads; of which backfilled records). An entry without a record, or whose record
-- is gone, counts as live; hours rolled up count at the hour's end, as in ledger_entries.
SELECT CAST(EXTRACT(EPOCH FROM u.at - now()) AS double precision), 1,
       CASE WHEN r.archive_backfilled THEN 1 ELSE 0 END
FROM image_archive_uploads AS u
LEFT JOIN image_generation_records AS r ON r.id = u.record_id
WHERE u.lane = 'lsky' AND u.at > now() - make_interval(secs => :seconds)
UNION ALL
SELECT CAST(EXTRACT(EPOCH FROM h.hour + interval '1 hour' - now()) AS double precision),
       h.uploads, h.backfill_uploads
FROM image_archive_upload_hours AS h
WHERE h.lane = 'lsky'
  AND h.hour + interval '1 hour' > now() - make_interval(secs => :seconds)
ORDER BY 1;

-- name: roll_up_ledger
-- The sweeper keeps the ledger small: uploads older than two hours become per-hour counts
-- (at most :limit rows a run), counts older than 32 days and bookings missed by an hour
-- go. Rows are moved, never copied, so two sweeps at once cannot count one twice.
WITH old AS (
    DELETE FROM image_archive_uploads
    WHERE ctid IN (SELECT ctid FROM image_archive_uploads
                   WHERE at < now() - interval '2 hours' AND state <> 'booked'
                   LIMIT :limit)
    RETURNING lane, at, record_id
),
hours AS (
    -- backfill_uploads: of them, uploads of backfilled records (live demand is the rest).
    INSERT INTO image_archive_upload_hours (lane, hour, uploads, backfill_uploads)
    SELECT old.lane, date_trunc('hour', old.at), count(*),
           count(*) FILTER (WHERE r.archive_backfilled)
    FROM old
    LEFT JOIN image_generation_records AS r ON r.id = old.record_id
    GROUP BY 1, 2
    ON CONFLICT (lane, hour)
        DO UPDATE SET uploads = image_archive_upload_hours.uploads + EXCLUDED.uploads,
                      backfill_uploads = image_archive_upload_hours.backfill_uploads
                                         + EXCLUDED.backfill_uploads
    RETURNING 1
),
expired AS (
    DELETE FROM image_archive_upload_hours WHERE hour < now() - interval '32 days'
    RETURNING 1
),
missed AS (
    DELETE FROM image_archive_uploads
    WHERE state = 'booked' AND at < now() - interval '1 hour'
    RETURNING 1
)
SELECT (SELECT count(*) FROM old), (SELECT count(*) FROM missed);

-- name: unpark_paused
-- `archive-ctl lane clear`: rows parked because the lane was paused are due now, spread
-- over :spread seconds so they do not all arrive at once; :limit a call (call again
-- until none: a row moved is inside the spread, so it is not taken twice). :by is who
-- reopened the lane (the story's `unparked`).
WITH unparked AS (
    UPDATE image_generation_records
    SET archive_next_run_at = now() + make_interval(secs => random() * :spread)
    WHERE id IN (SELECT id FROM image_generation_records
                 WHERE archive_status = 'PENDING' AND archive_enqueued_at IS NULL
                   AND archive_wait_reason = 'paused'
                   AND archive_next_run_at > now() + make_interval(secs => :spread)
                 LIMIT :limit
                 FOR UPDATE SKIP LOCKED)
    RETURNING id, archive_attempts, archive_next_run_at
),
noted AS (
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT id, now(), 0, archive_attempts, 'unparked',
           jsonb_build_object('by', CAST(:by AS text), 'due_at', archive_next_run_at)
    FROM unparked
)
SELECT id FROM unparked;

-- name: mark_redriven
-- `archive-ctl redrive-dlq`: the records of a batch of DLQ messages (:ids, with each one's
-- :message_ids), before their messages go back to the queue (row first, as the producer
-- does). A message lands in the DLQ when its attempts could not be concluded (crashes,
-- timeouts, the database gone), and the sweeper may have failed the row meanwhile: a
-- FAILED row gets a fresh attempt budget, as `requeue` gives one; a PENDING row is
-- stamped. RUNNING, SUCCEEDED and never-queued rows are left alone (the message is
-- acknowledged as a duplicate or a stray). Returns each marked row and what it was.
WITH wanted AS (
    SELECT DISTINCT ON (w.id) w.id, w.message_id
    FROM unnest(CAST(:ids AS bigint[]), CAST(:message_ids AS text[])) AS w (id, message_id)
    ORDER BY w.id
),
picked AS (
    SELECT r.id, r.archive_status AS was, r.archive_attempts AS attempts, wanted.message_id
    FROM image_generation_records AS r
    JOIN wanted ON wanted.id = r.id
    WHERE r.status = 'SUCCEEDED' AND r.archive_status IN ('PENDING', 'FAILED')
    FOR UPDATE OF r
),
marked AS (
    UPDATE image_generation_records AS r
    SET archive_status = 'PENDING',
        archive_attempts = CASE WHEN picked.was = 'FAILED' THEN 0 ELSE r.archive_attempts END,
        archive_failed_at = CASE WHEN picked.was = 'FAILED' THEN NULL ELSE r.archive_failed_at END,
        archive_next_run_at = CASE WHEN picked.was = 'FAILED' THEN now()
                                   ELSE COALESCE(r.archive_next_run_at, now()) END,
        archive_enqueued_at = now()
    FROM picked
    WHERE r.id = picked.id
    RETURNING r.id, r.archive_attempts, picked.was, picked.attempts, picked.message_id
),
noted AS (
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT id, now(), 0, archive_attempts, 'enqueued',
           jsonb_build_object('by', 'archive-ctl redrive-dlq', 'was', was,
                              'attempts', attempts, 'message_id', message_id)
    FROM marked
)
SELECT id, was FROM marked ORDER BY id;

-- name: expire_events
-- Retention (docs/explanation/stories.md), run by the sweeper: the oldest conclusions (archived,
-- failed) older than :retention seconds, :limit at most, of records that are not live
-- (SUCCEEDED, FAILED, never queued, or gone); each record's events up to its conclusion
-- are removed, and when that is its last conclusion, the events after it too (a
-- duplicate's or a late message's `received`, a vanished attempt's `lock_lost`): written
-- after the record concluded, they have no conclusion of their own to go with. It is the
-- last when the row's own conclusion time (archived_at, archive_failed_at: the same now()
-- as its event) is not later, or the row is gone; a row without one (an older release's,
-- never queued again) keeps what came after. A live record keeps every event: requeued
-- since, it is PENDING or RUNNING, and the rows are share-locked, so a requeue waits for
-- the delete or the delete passes the row by. A range of the conclusions' partial index,
-- each record looked up by its key (scalar subqueries: an anti-join would read the whole
-- table once), then a range of its own index. Returns (record id, events removed).
WITH oldest AS (
    SELECT e.record_id, e.at
    FROM image_archive_events AS e
    WHERE e.kind IN ('archived', 'failed')
      AND e.at < now() - make_interval(secs => :retention)
      AND NOT COALESCE((SELECT r.archive_status IN ('PENDING', 'RUNNING')
                        FROM image_generation_records AS r WHERE r.id = e.record_id), false)
    ORDER BY e.at
    LIMIT :limit
),
concluded AS (
    SELECT r.id, CASE r.archive_status WHEN 'SUCCEEDED' THEN r.archived_at
                                       WHEN 'FAILED' THEN r.archive_failed_at END AS at
    FROM image_generation_records AS r
    WHERE r.id IN (SELECT record_id FROM oldest)
      AND (r.archive_status IS NULL OR r.archive_status IN ('SUCCEEDED', 'FAILED'))
    FOR SHARE SKIP LOCKED
),
chapters AS (
    -- Its last conclusion when the row's is not later, or the row is gone (not joined).
    SELECT o.record_id, max(o.at) AS upto,
           bool_or(k.id IS NULL) OR COALESCE(max(k.at) <= max(o.at), false) AS last
    FROM oldest AS o
    LEFT JOIN concluded AS k ON k.id = o.record_id
    WHERE k.id IS NOT NULL
       OR NOT COALESCE((SELECT true FROM image_generation_records AS r
                        WHERE r.id = o.record_id), false)
    GROUP BY o.record_id
),
removed AS (
    DELETE FROM image_archive_events AS e
    USING chapters AS c
    WHERE e.record_id = c.record_id AND (e.at <= c.upto OR c.last)
    RETURNING e.record_id
)
SELECT record_id, count(*) FROM removed GROUP BY record_id ORDER BY record_id;

-- name: record_story
-- `archive-ctl show`: one record's row as the story needs it, its booked upload slot, how
-- many events it has (a count of its index range), and a FAILED record's error class as
-- its last `failed` event says it (permanent: a requeue would fail the same way).
SELECT r.id, r.status, r.archive_status, r.archive_attempts, r.archive_next_run_at,
       r.archive_wait_reason, r.archive_enqueued_at, r.archive_locked_by, r.archive_locked_at,
       r.archive_status = 'RUNNING' AND {{lock_expired}}, r.archive_error, r.archived_at,
       r.hosted_image_url, r.archive_staged_key, r.archive_staged_at, r.archive_staged_bytes,
       r.archive_altered, r.archive_may_be_hosted, r.archive_backfilled, r.started_at, now(),
       (SELECT min(u.at) FROM image_archive_uploads AS u
         WHERE u.record_id = r.id AND u.state = 'booked'),
       (SELECT count(*) FROM image_archive_events AS e WHERE e.record_id = r.id),
       CASE WHEN r.archive_status = 'FAILED' THEN {{failed_time}} END,
       r.archive_status = 'FAILED' AND r.archive_failed_at IS NULL,
       CASE WHEN r.archive_status = 'FAILED'
            THEN (SELECT e.detail ->> 'error_class' FROM image_archive_events AS e
                  WHERE e.record_id = r.id AND e.kind = 'failed'
                  ORDER BY e.at DESC, e.seq DESC LIMIT 1) END
FROM image_generation_records AS r
WHERE r.id = :record_id;

-- name: record_events
-- `archive-ctl show`: a record's newest :limit events, oldest first, and how many it has
-- (a record whose row is gone still has its story until the retention removes it).
SELECT at, attempt, kind, detail, (SELECT count(*) FROM image_archive_events
                                   WHERE record_id = :record_id)
FROM (SELECT at, seq, attempt, kind, detail
      FROM image_archive_events
      WHERE record_id = :record_id
      ORDER BY at DESC, seq DESC
      LIMIT :limit) AS newest
ORDER BY at, seq;

-- name: backfill_selection
-- The generations `archive-ctl backfill` queues: SUCCEEDED and never queued, started in
-- [:since, :until), of one user when :user_id is given. The partial index
-- image_generation_records_archive_backfill_idx has exactly the first two conditions.
status = 'SUCCEEDED'
AND archive_status IS NULL
AND started_at >= CAST(:since AS timestamptz)
AND started_at < CAST(:until AS timestamptz)
AND (CAST(:user_id AS bigint) IS NULL OR user_id = CAST(:user_id AS bigint))

-- name: count_backfill
SELECT count(*) FROM image_generation_records WHERE {{backfill_selection}};

-- name: preview_backfill
SELECT id, started_at, user_id
FROM image_generation_records
WHERE {{backfill_selection}}
ORDER BY started_at, id
LIMIT :limit;

-- name: mark_backfill_page
-- One backfill page, marked as mark_for_enqueue marks (PENDING, due now, stamped); the
-- caller then sends the messages. Keyset paging after (:after_started, :after_id) keeps
-- each page an index range read. A marked row leaves the selection and rows another
-- transaction has locked are skipped, so concurrent runs or a re-run never mark a row twice
-- (the caller counts the range again at its end, for the rows skipped). archive_backfilled
-- marks the row backfilled for good: served after live records.
WITH picked AS (
    SELECT id
    FROM image_generation_records
    WHERE {{backfill_selection}}
      AND (started_at, id) > (CAST(:after_started AS timestamptz), CAST(:after_id AS bigint))
    ORDER BY started_at, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
marked AS (
    UPDATE image_generation_records AS r
    SET archive_status = 'PENDING',
        archive_next_run_at = now(),
        archive_enqueued_at = now(),
        archive_backfilled = true
    FROM picked
    WHERE r.id = picked.id AND r.archive_status IS NULL
    RETURNING r.id, r.started_at, r.archive_enqueued_at, r.archive_attempts
),
noted AS (
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT id, now(), 0, archive_attempts, 'enqueued',
           jsonb_build_object('by', 'archive-ctl backfill')
    FROM marked
)
SELECT id, started_at, archive_enqueued_at FROM marked;

-- name: unmark_backfill
-- Undo the part of a backfill page an interruption kept from being sent: never queued
-- again, so the next run takes those rows. Only rows exactly as the page left them (its
-- stamp as due time and enqueue time: no worker or sweeper has touched them).
WITH unmarked AS (
    UPDATE image_generation_records
    SET archive_status = NULL,
        archive_next_run_at = NULL,
        archive_enqueued_at = NULL,
        archive_backfilled = false
    WHERE id = ANY(CAST(:ids AS bigint[]))
      AND archive_status = 'PENDING' AND archive_backfilled
      AND archive_enqueued_at = CAST(:stamp AS timestamptz)
      AND archive_next_run_at = CAST(:stamp AS timestamptz)
    RETURNING id, archive_attempts
),
noted AS (
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT id, now(), 0, archive_attempts, 'dequeued',
           jsonb_build_object('by', 'archive-ctl backfill',
                              'why', 'interrupted before its message was sent')
    FROM unmarked
)
SELECT id FROM unmarked;

-- name: lane_demand
-- `archive-ctl backfill`: what the lane has before backfilled records may have more. Live rows (not
-- archive_backfilled) waiting for the lane (a host pause, a pacing slot), and live rows due
-- now (RUNNING, or PENDING and due) that have no slot yet; backfilled rows queued (PENDING
-- other than in backoff), and backfilled rows in the lane (those, or RUNNING) with no
-- slot. Range reads of the PENDING and RUNNING partial indexes, at most :limit rows.
WITH lane AS (
    SELECT id, archive_status, archive_backfilled, archive_wait_reason,
           COALESCE(archive_next_run_at <= now(), true) AS due
    FROM image_generation_records
    WHERE archive_status = 'PENDING'
    UNION ALL
    SELECT id, archive_status, archive_backfilled, archive_wait_reason, true
    FROM image_generation_records
    WHERE archive_status = 'RUNNING'
    LIMIT :limit
),
seen AS (
    SELECT lane.archive_backfilled AS history, lane.due,
           lane.archive_status = 'RUNNING' AS running,
           COALESCE(lane.archive_wait_reason IN ('paced', 'paused'), false) AS waiting,
           COALESCE(lane.archive_wait_reason = 'backoff', false) AS backoff,
           EXISTS (SELECT 1 FROM image_archive_uploads AS u
                   WHERE u.record_id = lane.id AND u.state <> 'done') AS slotted
    FROM lane
)
SELECT count(*) FILTER (WHERE NOT history AND waiting),
       count(*) FILTER (WHERE NOT history AND due AND NOT waiting AND NOT slotted),
       count(*) FILTER (WHERE history AND NOT running AND NOT backoff),
       count(*) FILTER (WHERE history AND NOT backoff AND NOT slotted)
FROM seen;

-- name: count_never_queued
-- `archive-ctl status`: never-queued SUCCEEDED generations (what a backfill would take),
-- counted on the backfill's partial index alone and only up to :limit.
SELECT count(*) FROM (SELECT 1 FROM image_generation_records
                      WHERE status = 'SUCCEEDED' AND archive_status IS NULL
                      LIMIT :limit) AS never_queued;

-- name: altered_counts
-- `archive-ctl status`: archives whose stored bytes Lsky changed, all time and archived in
-- the last 24 h. Reads only archive_altered_idx, and stops counting at :limit so a host
-- that re-encodes everything cannot make `status` slow.
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM image_generation_records
                            WHERE archive_altered LIMIT :limit) AS altered),
    (SELECT count(*) FROM (SELECT 1 FROM image_generation_records
                            WHERE archive_altered AND archived_at >= now() - interval '24 hours'
                            LIMIT :limit) AS recent);

-- name: record_staged
-- SET items for a row that gives its attempt back: a copy staged during the attempt
-- (:staged_key, with the SHA-256 and length captured) replaces the row's; NULL keeps what
-- the row has, unless :forget_staged (the row's copy did not match what was captured).
archive_staged_key = CASE WHEN CAST(:staged_key AS text) IS NOT NULL
                               THEN CAST(:staged_key AS text)
                          WHEN CAST(:forget_staged AS boolean) THEN NULL
                          ELSE archive_staged_key END,
archive_staged_at = CASE WHEN CAST(:staged_key AS text) IS NOT NULL THEN now()
                         WHEN CAST(:forget_staged AS boolean) THEN NULL
                         ELSE archive_staged_at END,
archive_staged_sha256 = CASE WHEN CAST(:staged_key AS text) IS NOT NULL
                                  THEN CAST(:staged_sha256 AS text)
                             WHEN CAST(:forget_staged AS boolean) THEN NULL
                             ELSE archive_staged_sha256 END,
archive_staged_bytes = CASE WHEN CAST(:staged_key AS text) IS NOT NULL
                                 THEN CAST(:staged_bytes AS bigint)
                            WHEN CAST(:forget_staged AS boolean) THEN NULL
                            ELSE archive_staged_bytes END

-- name: record_sent
-- SET item: what this attempt's upload sent, when Lsky may have kept it (:sent, JSON);
-- NULL keeps what an earlier attempt recorded.
archive_sent = COALESCE(CAST(:sent AS jsonb), archive_sent)

-- name: attempt_events
-- The events an attempt kept in memory (:events, a JSON array of {kind, at, detail},
-- oldest first: lib.state.events.EventLog) as rows (at, seq, kind, detail) for the INSERT
-- of the statement that concludes it. A time after the statement's own is its own: the
-- attempt's clock is the claim's moved on, and must not sort an event after its conclusion.
SELECT LEAST(COALESCE(CAST(e.value ->> 'at' AS timestamptz), now()), now()) AS at,
       CAST(e.n AS int) AS seq, e.value ->> 'kind' AS kind,
       COALESCE(e.value -> 'detail', '{}') AS detail
FROM jsonb_array_elements(CAST(:events AS jsonb)) WITH ORDINALITY AS e (value, n)

-- name: note_conclusion
-- The INSERT of retry, fail and release: the attempt's events, then the statement's own
-- (:kind, :detail and the row's next run), or `lock_lost` when the lock had passed on and
-- `concluded` changed nothing. One statement: no round trip of its own.
INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
SELECT :record_id, e.at, e.seq, :attempt, e.kind, e.detail
FROM ({{attempt_events}}
      UNION ALL
      SELECT now(), jsonb_array_length(CAST(:events AS jsonb)) + 1,
             CASE WHEN EXISTS (SELECT 1 FROM concluded) THEN CAST(:kind AS text)
                  ELSE 'lock_lost' END,
             CASE WHEN EXISTS (SELECT 1 FROM concluded)
                  THEN CAST(:detail AS jsonb)
                       || jsonb_build_object('next_run_at',
                                             (SELECT archive_next_run_at FROM concluded))
                  ELSE jsonb_build_object('write', CAST(:kind AS text)) END) AS e

-- name: outbox_archived
-- succeed's completion event (docs/reference/events-and-metrics.md, "Completion events"): of the row it wrote
-- (`written`), `Image Restored` when the row had another hosted URL before (`before`: a
-- repair re-published the record; the detail keeps the old URL and Lsky key), else `Image
-- Archived`. :event_detail is what the worker knows (URL, type, size, key); :event_id is
-- NULL when events are off. ON CONFLICT: an event id is written once, whatever happens.
INSERT INTO image_archive_outbox (event_id, record_id, detail_type, detail)
SELECT CAST(:event_id AS uuid), written.id,
       CASE WHEN was.restored THEN 'Image Restored' ELSE 'Image Archived' END,
       CAST(:event_detail AS jsonb)
       || jsonb_build_object('recordId', CAST(written.id AS text),
                             'attempts', written.archive_attempts)
       || CASE WHEN was.restored
               THEN jsonb_build_object('previousHostedUrl', left(before.hosted_image_url, 4096),
                                       'previousKey', left(before.hosted_key, 200))
               ELSE '{}' END
FROM written
CROSS JOIN before
CROSS JOIN LATERAL (
    SELECT before.hosted_image_url IS NOT NULL
           AND before.hosted_image_url IS DISTINCT FROM CAST(:hosted_url AS text) AS restored
) AS was
WHERE CAST(:event_id AS uuid) IS NOT NULL
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id, detail_type, detail, created_at

-- name: outbox_failed
-- The completion event of the rows a statement made FAILED (`failures`: id,
-- archive_attempts, archive_error): the worker's `fail` (its :event_id) and the claim's and
-- the sweeper's (an id minted here), written only when events are published (:publish).
INSERT INTO image_archive_outbox (event_id, record_id, detail_type, detail)
SELECT COALESCE(CAST(:event_id AS uuid), gen_random_uuid()), f.id, 'Image Archive Failed',
       jsonb_build_object('recordId', CAST(f.id AS text), 'attempts', f.archive_attempts,
                          'error', f.archive_error)
FROM failures AS f
WHERE CAST(:publish AS boolean)
RETURNING event_id, record_id, detail_type, detail, created_at

-- name: event_of_failure
-- What a `failed` event of the story adds when its completion event was written (`target`
-- the failed row, `outboxed` the events): the event's id, which its publication is noted by.
COALESCE((SELECT jsonb_build_object('event_id', o.event_id) FROM outboxed AS o
          WHERE o.record_id = target.id), '{}')

-- name: outbox_published
-- Events published (:published, each with :published_at, when PutEvents answered) leave the
-- outbox, with the note their conclusion's story gets (note_publication). :by published them.
DELETE FROM image_archive_outbox AS o
USING unnest(CAST(:published AS uuid[]), CAST(:published_at AS timestamptz[])) AS p (event_id, at)
WHERE o.event_id = p.event_id
RETURNING o.record_id, o.event_id,
          jsonb_build_object('published_at', p.at, 'published_by', CAST(:by AS text),
                             'detail_type', o.detail_type) AS note

-- name: note_publication
-- The story of a completion event (`published`: record_id, event_id, note): its note is
-- added to the conclusion event (archived, failed) that carries its id. A conclusion's
-- events are never many: a range of the record's index.
UPDATE image_archive_events AS e
SET detail = e.detail || n.note
FROM published AS n
WHERE e.record_id = n.record_id AND e.kind IN ('archived', 'failed')
  AND e.detail ->> 'event_id' = CAST(n.event_id AS text)
RETURNING 1

-- name: original_replaces
-- A record keeps one original: a newer one (archived again, or the audit's) replaces the
-- row; the older object stays in the versioned bucket. The same key recorded again (a
-- restore published it) keeps what the row knows of S3's answer.
ON CONFLICT (record_id) DO UPDATE
SET bucket = EXCLUDED.bucket, key = EXCLUDED.key,
    version_id = CASE WHEN kept.key = EXCLUDED.key AND kept.confirmed THEN kept.version_id
                      ELSE EXCLUDED.version_id END,
    sha256 = EXCLUDED.sha256, bytes = EXCLUDED.bytes, mime_type = EXCLUDED.mime_type,
    source = EXCLUDED.source, kept_at = now(),
    confirmed = EXCLUDED.confirmed OR (kept.key = EXCLUDED.key AND kept.confirmed)

-- name: original_confirmed
-- Originals S3 holds (:confirmed_records, :confirmed_keys, :confirmed_versions, parallel:
-- its answer to the PUT, or the audit's HEAD): each row still unconfirmed with that very
-- key is confirmed with its version; a row replaced since, or confirmed already, is left.
UPDATE image_archive_originals AS o
SET confirmed = true, version_id = c.version_id
FROM unnest(CAST(:confirmed_records AS bigint[]), CAST(:confirmed_keys AS text[]),
            CAST(:confirmed_versions AS text[])) AS c (record_id, key, version_id)
WHERE o.record_id = c.record_id AND o.key = c.key AND NOT o.confirmed
RETURNING o.record_id

-- name: original_of
-- A record's kept original, as lib.state.claim.KeptOriginal.from_row reads it.
SELECT bucket, key, version_id, sha256, bytes, mime_type, source, confirmed
FROM image_archive_originals
WHERE record_id = :record_id;

-- name: originals_unconfirmed
-- The audit's look at the originals no container confirmed: recorded unconfirmed more than
-- :grace seconds ago (its partial index), oldest first.
SELECT record_id, bucket, key, bytes
FROM image_archive_originals
WHERE NOT confirmed AND kept_at < now() - make_interval(secs => :grace)
ORDER BY kept_at
LIMIT :limit;

-- name: confirm_originals
-- The audit's HEAD found these originals whole (original_confirmed).
WITH confirmed AS ({{original_confirmed}})
SELECT count(*) FROM confirmed;

-- name: original_absent
-- An unconfirmed original S3 does not hold (the audit's HEAD): its row goes, only while it
-- is still that key and unconfirmed, and the record is due for the audit now, whose GET
-- of the hosted copy keeps a new one. Nothing in the bucket is deleted.
WITH gone AS (
    DELETE FROM image_archive_originals
    WHERE record_id = :record_id AND key = :key AND NOT confirmed
    RETURNING record_id
),
due AS (
    UPDATE image_archive_audits AS a SET due_at = now()
    FROM gone WHERE a.record_id = gone.record_id
    RETURNING 1
)
SELECT record_id FROM gone;

-- name: forget_staged
-- SET items for a row whose staged copy is published or dropped.
archive_staged_key = NULL,
archive_staged_at = NULL,
archive_staged_sha256 = NULL,
archive_staged_bytes = NULL

-- name: staged_summary
-- Staged copies waiting to be published (PENDING, RUNNING), how long the oldest has
-- waited, and FAILED rows that kept theirs for a replay. Reads the staged index only.
SELECT count(*) FILTER (WHERE archive_status IN ('PENDING', 'RUNNING')),
       CAST(COALESCE(EXTRACT(EPOCH FROM now() - min(archive_staged_at)
                     FILTER (WHERE archive_status IN ('PENDING', 'RUNNING'))), 0)
            AS double precision),
       count(*) FILTER (WHERE archive_status = 'FAILED')
FROM image_generation_records
WHERE archive_staged_key IS NOT NULL;

-- name: outbox_take
-- The sweeper's page of completion events to publish (lib.publish.sweep): those older than
-- the grace period (their container published them and has not claimed since, or never
-- could), oldest first, and those this run's own statements wrote (:own). Each is kept for
-- :lease seconds (retry_at), so a second sweeper passes it by while this one publishes.
-- Two range reads of the created_at index, not the table.
WITH due AS (
    SELECT event_id FROM image_archive_outbox
    WHERE created_at < now() - make_interval(secs => :grace)
      AND (retry_at IS NULL OR retry_at <= now())
    ORDER BY created_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
own AS (
    SELECT event_id FROM image_archive_outbox
    WHERE event_id = ANY(CAST(:own AS uuid[])) AND (retry_at IS NULL OR retry_at <= now())
    FOR UPDATE SKIP LOCKED
),
picked AS (SELECT event_id FROM due UNION SELECT event_id FROM own)
UPDATE image_archive_outbox AS o
SET retry_at = now() + make_interval(secs => :lease)
FROM picked
WHERE o.event_id = picked.event_id
RETURNING o.event_id, o.record_id, o.detail_type, o.detail, o.created_at, o.tries,
          o.rejections, now()

-- name: outbox_settle
-- What the sweeper's PutEvents calls came to, in one statement: the published events
-- (:published, :published_at) leave the outbox; the missed ones (:missed, each with its
-- :errors and whether it was :rejected for good) count a try and are free for the next
-- sweep; the :dropped ones (refused for good too often, :dropped_errors) leave it too. Each
-- conclusion's story notes what became of its event.
WITH published_rows AS ({{outbox_published}}),
missed AS (
    UPDATE image_archive_outbox AS o
    SET tries = o.tries + 1,
        rejections = o.rejections + CASE WHEN m.rejected THEN 1 ELSE 0 END,
        last_error = m.error,
        retry_at = NULL
    FROM unnest(CAST(:missed AS uuid[]), CAST(:errors AS text[]),
                CAST(:rejected AS boolean[])) AS m (event_id, error, rejected)
    WHERE o.event_id = m.event_id
    RETURNING 1
),
dropped AS (
    DELETE FROM image_archive_outbox AS o
    USING unnest(CAST(:dropped AS uuid[]), CAST(:dropped_errors AS text[])) AS d (event_id, error)
    WHERE o.event_id = d.event_id
    RETURNING o.record_id, o.event_id,
              jsonb_build_object('dropped_at', now(), 'dropped_because', d.error,
                                 'tries', o.tries + 1, 'detail_type', o.detail_type) AS note
),
published AS (SELECT * FROM published_rows UNION ALL SELECT * FROM dropped),
told AS ({{note_publication}})
SELECT (SELECT count(*) FROM published_rows), (SELECT count(*) FROM missed),
       (SELECT count(*) FROM dropped);

-- name: outbox_summary
-- `archive-ctl status` and the sweeper's metrics: events waiting to be published (counted
-- up to :limit) and how long the oldest has waited (0 when none): index reads.
SELECT (SELECT count(*) FROM (SELECT 1 FROM image_archive_outbox LIMIT :limit) AS waiting),
       CAST(COALESCE(EXTRACT(EPOCH FROM now() - (SELECT min(created_at)
                                                  FROM image_archive_outbox)), 0)
            AS double precision);

-- name: record_outbox
-- `archive-ctl show`: the record's completion events not published yet.
SELECT event_id, detail_type, created_at, tries, last_error
FROM image_archive_outbox
WHERE event_id = ANY(CAST(:event_ids AS uuid[]))
ORDER BY created_at;

-- ---------------------------------------------------------------------------------------
-- `archive-ctl migrate` (lib.cli.migrate) and `archive-ctl grants` (lib.cli.grants): the
-- catalog, the migration's advisory lock (its key is the one archive_migration.sql takes),
-- and the migration's own row updates. docs/explanation/live-migration.md says why each is shaped so.

-- name: schema_catalog
-- Which of the declared objects exist, as (kind, name, table, flag, definition): flag says
-- whether an index is valid (an interrupted CONCURRENTLY build leaves it INVALID) and
-- whether a constraint is validated; a constraint's definition is compared with the
-- declared one. Catalog reads only: no lock on the tables themselves.
SELECT 'table', c.relname, c.relname, true, NULL
FROM pg_class AS c
WHERE c.relname = ANY(CAST(:tables AS text[])) AND c.relkind IN ('r', 'p')
  AND pg_table_is_visible(c.oid)
UNION ALL
SELECT 'column', a.attname, c.relname, true, NULL
FROM pg_attribute AS a
JOIN pg_class AS c ON c.oid = a.attrelid
WHERE c.relname = ANY(CAST(:tables AS text[])) AND c.relkind IN ('r', 'p')
  AND pg_table_is_visible(c.oid) AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index', c.relname, t.relname, i.indisvalid, NULL
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
JOIN pg_class AS t ON t.oid = i.indrelid
WHERE c.relname = ANY(CAST(:indexes AS text[])) AND pg_table_is_visible(c.oid)
UNION ALL
SELECT 'constraint', k.conname, t.relname, k.convalidated, pg_get_constraintdef(k.oid)
FROM pg_constraint AS k
JOIN pg_class AS t ON t.oid = k.conrelid
WHERE k.conname = ANY(CAST(:constraints AS text[])) AND pg_table_is_visible(t.oid);

-- name: migration_lock_try
SELECT pg_try_advisory_lock(CAST(:key AS bigint));

-- name: migration_lock_holder
-- The session that has the migration's lock (a bigint key: classid is its high half).
SELECT a.pid, a.backend_start, a.application_name
FROM pg_locks AS l
JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND (CAST(l.classid AS bigint) << 32) + CAST(l.objid AS bigint) = CAST(:key AS bigint);

-- name: table_lock_holders
-- The sessions with a lock on :table, longest-running first: what a brief exclusive
-- request gave up waiting for. No query text: it may contain other people's values.
SELECT a.pid, a.application_name, a.state,
       EXTRACT(EPOCH FROM now() - COALESCE(a.xact_start, a.query_start))
FROM pg_stat_activity AS a
WHERE a.pid <> pg_backend_pid()
  AND a.pid IN (SELECT l.pid FROM pg_locks AS l
                WHERE l.locktype = 'relation' AND l.granted
                  AND l.relation = to_regclass(CAST(:table AS text)))
ORDER BY 4 DESC NULLS LAST
LIMIT 3;

-- name: legacy_statuses
-- archive_status values the CHECK does not allow (:allowed), by value and by whether the
-- row has a hosted URL. A full scan (ACCESS SHARE only), run only while the CHECK is
-- missing or NOT VALID. hosted_image_url is read through to_jsonb because a table from
-- before the archive columns may not have it yet (this run adds it later).
SELECT r.archive_status, (to_jsonb(r) ->> 'hosted_image_url') IS NOT NULL, count(*)
FROM image_generation_records AS r
WHERE NOT (r.archive_status = ANY(CAST(:allowed AS text[])))
GROUP BY 1, 2
ORDER BY 3 DESC, 1, 2;

-- name: may_have_uploaded
-- A row an earlier attempt may have left on Lsky without recording it: RUNNING (the worker
-- may have been killed after the upload), or PENDING/FAILED after an attempt (whose answer
-- may have been lost; a FAILED row can be requeued). A hosted_image_url does not clear it:
-- looking up first then adopts that very image. `s` is the row as it is, or will be.
(s.archive_status = 'RUNNING'
 OR (s.archive_status IN ('PENDING', 'FAILED') AND s.archive_attempts > 0))

-- name: mark_may_be_hosted
-- When migrate adds archive_may_be_hosted (DEFAULT false) to a table that has archive
-- states: rows an older release may have uploaded get true, so their next attempt looks
-- the image up instead of storing a second copy. A batch is the next :batch rows by
-- primary key after :after, one short transaction that also keeps the step's progress
-- (its row in image_archive_migration_steps: a run that stops resumes after it); returns
-- the last id looked at (NULL: done) and how many rows were marked.
WITH span AS (
    SELECT id FROM image_generation_records
    WHERE id > :after ORDER BY id LIMIT :batch
),
marked AS (
    UPDATE image_generation_records AS s
    SET archive_may_be_hosted = true
    FROM span
    WHERE s.id = span.id AND NOT s.archive_may_be_hosted AND {{may_have_uploaded}}
    RETURNING s.id
),
progress AS (
    UPDATE image_archive_migration_steps
    SET after_id = (SELECT max(id) FROM span)
    WHERE step = :step_name AND EXISTS (SELECT 1 FROM span)
    RETURNING 1
)
SELECT (SELECT max(id) FROM span), (SELECT count(*) FROM marked);

-- name: count_may_have_uploaded
-- `migrate --dry-run`: how many rows mark_may_be_hosted would mark when it adds the column.
SELECT count(*) FROM image_generation_records AS s WHERE {{may_have_uploaded}};

-- name: count_left_to_mark
-- `migrate --dry-run` with the marking begun: the rows after its progress it would mark.
SELECT count(*) FROM image_generation_records AS s
WHERE s.id > :after AND NOT s.archive_may_be_hosted AND {{may_have_uploaded}};

-- name: unfinished_migration_steps
-- The data steps an earlier run noted and did not finish, with their progress.
SELECT step, after_id FROM image_archive_migration_steps ORDER BY step;

-- name: note_migration_step
-- Before the change that calls for a data step: it is to be done, by this run or the next.
INSERT INTO image_archive_migration_steps (step) VALUES (:step) ON CONFLICT (step) DO NOTHING;

-- name: finish_migration_step
DELETE FROM image_archive_migration_steps WHERE step = :step;

-- name: map_legacy_statuses
-- Legacy archive_status values to states (lib.cli.legacy_status): :legacy, :hosted and
-- :target are parallel arrays, one entry per (value, has a hosted URL). Batches as in
-- mark_may_be_hosted. A mapped row that may have been uploaded gets archive_may_be_hosted.
-- The UPDATE re-checks the old value, so a row a writer changed meanwhile keeps its write.
WITH span AS (
    SELECT id FROM image_generation_records
    WHERE id > :after ORDER BY id LIMIT :batch
),
s AS (
    SELECT r.id, r.archive_status AS legacy, m.target AS archive_status, r.archive_attempts
    FROM image_generation_records AS r
    JOIN span ON span.id = r.id
    JOIN unnest(CAST(:legacy AS text[]), CAST(:hosted AS boolean[]), CAST(:target AS text[]))
         AS m (legacy, hosted, target)
      ON m.legacy = r.archive_status AND m.hosted = (r.hosted_image_url IS NOT NULL)
),
mapped AS (
    UPDATE image_generation_records AS r
    SET archive_status = s.archive_status,
        archive_may_be_hosted = r.archive_may_be_hosted OR {{may_have_uploaded}}
    FROM s
    WHERE r.id = s.id AND r.archive_status = s.legacy
    RETURNING r.id
)
SELECT (SELECT max(id) FROM span), (SELECT count(*) FROM mapped);

-- name: role_of
-- The role `archive-ctl grants` checks (the connected one when :role is NULL), and whether
-- it is a superuser, which has every privilege.
SELECT r.rolname, r.rolsuper
FROM pg_roles AS r
WHERE r.rolname = COALESCE(CAST(:role AS text), CAST(current_user AS text));

-- name: privileges_of
-- For each needed (table, column or '' for the whole table, privilege), in order: whether
-- the table and the column exist, whether :role has the privilege and USAGE on the table's
-- schema (NULL where the object is missing), and the schema's name.
SELECT n.tab, n.col, n.priv,
       c.oid IS NOT NULL,
       n.col = '' OR a.attnum IS NOT NULL,
       CASE WHEN c.oid IS NULL THEN NULL
            WHEN n.col = '' THEN has_table_privilege(CAST(:role AS name), c.oid, n.priv)
            WHEN a.attnum IS NULL THEN NULL
            ELSE has_column_privilege(CAST(:role AS name), c.oid, a.attnum, n.priv) END,
       CASE WHEN c.oid IS NOT NULL
            THEN has_schema_privilege(CAST(:role AS name), c.relnamespace, 'USAGE') END,
       ns.nspname
FROM unnest(CAST(:tables AS text[]), CAST(:columns AS text[]), CAST(:privileges AS text[]))
     WITH ORDINALITY AS n (tab, col, priv, ord)
LEFT JOIN pg_class AS c ON c.oid = to_regclass(n.tab)
LEFT JOIN pg_namespace AS ns ON ns.oid = c.relnamespace
LEFT JOIN pg_attribute AS a
       ON a.attrelid = c.oid AND a.attname = n.col AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY n.ord;

-- The audit of hosted images (lib.audit, lib.state.audits; docs/explanation/audit-and-repair.md). A check never
-- writes the generation's row; a restore does, through the archive's own state machine.

-- name: audit_target
-- What a check needs of one audit row `a` (its record `r`, its original `o`): the hosted
-- URL, what Lsky reported of the stored file and what was sent, the provider's URL.
SELECT a.record_id, r.id IS NOT NULL, r.archive_status, r.hosted_image_url,
       r.hosted_response ->> 'sha1', r.hosted_response ->> 'size',
       r.hosted_response -> '_archive' -> 'sent' ->> 'sha1', r.archive_altered,
       r.image_url, a.verdict, a.lost, r.hosted_response ->> 'key',
       o.bucket, o.key, o.version_id, o.sha256, o.bytes, o.mime_type, o.source

-- name: take_audits
-- The rotation: the audits due, oldest due first (its index), each leased (due again at
-- :lease seconds from now) so that a second run, or `archive-ctl audit`, takes others; a
-- run that dies leaves them due again when the lease ends. Rows whose record is not
-- archived (a restore under way, a requeue, a deleted generation) come back too, and are
-- passed over by the check (`pass_audits`).
WITH due AS (
    SELECT record_id FROM image_archive_audits
    WHERE due_at <= now()
    ORDER BY due_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
leased AS (
    UPDATE image_archive_audits AS a
    SET due_at = now() + make_interval(secs => :lease)
    FROM due
    WHERE a.record_id = due.record_id
    RETURNING a.*
)
{{audit_target}}
FROM leased AS a
LEFT JOIN image_generation_records AS r ON r.id = a.record_id
LEFT JOIN image_archive_originals AS o ON o.record_id = a.record_id
ORDER BY a.record_id;

-- name: take_audits_chosen
-- `archive-ctl audit --id/--since`: archived records chosen by id, or archived since
-- :since (NULL: any), due or not, after :after_id in id order, enrolled if they were not
-- and leased like the rotation's (:lease NULL, a dry run: nothing written). Not the
-- rotation's index: an operator's pass over the records.
WITH chosen AS (
    SELECT r.id FROM image_generation_records AS r
    WHERE r.archive_status = 'SUCCEEDED'
      AND (CAST(:ids AS bigint[]) IS NULL OR r.id = ANY(CAST(:ids AS bigint[])))
      AND (CAST(:since AS timestamptz) IS NULL OR r.archived_at >= CAST(:since AS timestamptz))
      AND r.id > :after_id
    ORDER BY r.id
    LIMIT :limit
),
leased AS (
    INSERT INTO image_archive_audits AS a (record_id, due_at)
    SELECT id, now() + make_interval(secs => CAST(:lease AS int)) FROM chosen
    WHERE CAST(:lease AS int) IS NOT NULL
    ON CONFLICT (record_id) DO UPDATE SET due_at = EXCLUDED.due_at
)
SELECT c.id, r.id IS NOT NULL, r.archive_status, r.hosted_image_url,
       r.hosted_response ->> 'sha1', r.hosted_response ->> 'size',
       r.hosted_response -> '_archive' -> 'sent' ->> 'sha1', r.archive_altered,
       r.image_url, a.verdict, COALESCE(a.lost, false), r.hosted_response ->> 'key',
       o.bucket, o.key, o.version_id, o.sha256, o.bytes, o.mime_type, o.source
FROM chosen AS c
JOIN image_generation_records AS r ON r.id = c.id
LEFT JOIN image_archive_audits AS a ON a.record_id = c.id
LEFT JOIN image_archive_originals AS o ON o.record_id = c.id
ORDER BY c.id;

-- name: peek_audits
-- A dry run of the rotation: the first :limit audits due, as take_audits would take them,
-- with nothing written.
{{audit_target}}
FROM image_archive_audits AS a
LEFT JOIN image_generation_records AS r ON r.id = a.record_id
LEFT JOIN image_archive_originals AS o ON o.record_id = a.record_id
WHERE a.due_at <= now()
ORDER BY a.due_at, a.record_id
LIMIT :limit;

-- name: enrol_archived
-- The walk: the next :batch records by id after the walk's position, the archived ones
-- enrolled (due now: older archives are checked at the audit's own pace) unless they are. At the
-- end of the table the pass is finished; the next begins :period seconds after the last
-- began. A walk another run has locked is skipped. Reads the primary key, :batch rows a call.
WITH walk AS (
    SELECT after_id, started_at FROM image_archive_audit_walk
    WHERE walk = 'archived'
      AND (after_id IS NOT NULL OR started_at IS NULL
           OR started_at < now() - make_interval(secs => :period))
    FOR UPDATE SKIP LOCKED
),
page AS (
    SELECT r.id, r.archive_status FROM image_generation_records AS r, walk
    WHERE r.id > COALESCE(walk.after_id, -1)
    ORDER BY r.id
    LIMIT :batch
),
enrolled AS (
    INSERT INTO image_archive_audits (record_id, due_at)
    SELECT id, now() FROM page WHERE archive_status = 'SUCCEEDED'
    ON CONFLICT (record_id) DO NOTHING
    RETURNING 1
),
moved AS (
    UPDATE image_archive_audit_walk AS w
    SET after_id = CASE WHEN (SELECT count(*) FROM page) < :batch THEN NULL
                        ELSE (SELECT max(id) FROM page) END,
        started_at = CASE WHEN walk.after_id IS NULL THEN now() ELSE w.started_at END,
        finished_at = CASE WHEN (SELECT count(*) FROM page) < :batch THEN now()
                           ELSE w.finished_at END
    FROM walk
    WHERE w.walk = 'archived'
    RETURNING w.after_id
)
SELECT EXISTS (SELECT 1 FROM walk), (SELECT count(*) FROM enrolled),
       (SELECT count(*) FROM page), (SELECT after_id FROM moved);

-- name: record_audits
-- A run's verdicts for one batch (:results, a JSON array of {record_id, verdict, url,
-- lost, detail}; verdict null: unreachable, no verdict), in one statement: due again after
-- :period seconds (unreachable: after :retry seconds), the story's `audited` where the
-- verdict is not intact or changed (a first intact one is no news), `lost_on_host` where it became lost. The generation's
-- row is not touched.
WITH result AS (
    SELECT CAST(x ->> 'record_id' AS bigint) AS record_id, x ->> 'verdict' AS verdict,
           x ->> 'url' AS url, COALESCE(CAST(x ->> 'lost' AS boolean), false) AS lost,
           COALESCE(x -> 'detail', '{}') AS detail
    FROM jsonb_array_elements(CAST(:results AS jsonb)) AS x
),
before AS (
    SELECT a.record_id, a.verdict, a.lost
    FROM image_archive_audits AS a JOIN result USING (record_id)
),
written AS (
    UPDATE image_archive_audits AS a
    SET due_at = now() + make_interval(secs => CASE WHEN result.verdict IS NULL
                                                    THEN CAST(:retry AS int)
                                                    ELSE CAST(:period AS int) END),
        checked_at = CASE WHEN result.verdict IS NULL THEN a.checked_at ELSE now() END,
        verdict = COALESCE(result.verdict, a.verdict),
        verdict_since = CASE WHEN result.verdict IS NULL THEN a.verdict_since
                             WHEN result.verdict IS DISTINCT FROM a.verdict THEN now()
                             ELSE a.verdict_since END,
        checked_url = COALESCE(result.url, a.checked_url),
        unreachable_since = CASE WHEN result.verdict IS NOT NULL THEN NULL
                                 ELSE COALESCE(a.unreachable_since, now()) END,
        lost = CASE WHEN result.verdict IS NULL THEN a.lost ELSE result.lost END,
        detail = result.detail
    FROM result
    WHERE a.record_id = result.record_id
    RETURNING a.record_id
),
noted AS (
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT result.record_id, now(), e.seq, 0, e.kind, e.detail
    FROM result JOIN before USING (record_id)
    CROSS JOIN LATERAL (
        SELECT 1 AS seq, 'audited' AS kind,
               jsonb_build_object('verdict', result.verdict, 'was', before.verdict)
               || result.detail AS detail
        -- A first check that finds the copy intact is no news.
        WHERE result.verdict IS NOT NULL
          AND (result.verdict <> 'intact'
               OR (before.verdict IS NOT NULL AND result.verdict <> before.verdict))
        UNION ALL
        SELECT 2, 'lost_on_host', jsonb_build_object('verdict', result.verdict)
                                  || result.detail
        WHERE result.verdict IS NOT NULL AND result.lost AND NOT before.lost
    ) AS e
    RETURNING record_id, kind
)
SELECT (SELECT count(*) FROM written),
       COALESCE((SELECT array_agg(record_id) FROM noted WHERE kind = 'lost_on_host'), '{}');

-- name: expire_audit_events
-- The audit's own events (audited, original_kept, lost_on_host) older than :retention
-- seconds, :limit at most, oldest first, by their partial index: written after a record
-- concluded, they have no conclusion of their own that the story's retention
-- (expire_events) would take them with. The audit table keeps the verdicts. Returns how
-- many went.
WITH old AS (
    SELECT ctid FROM image_archive_events
    WHERE kind IN ('audited', 'original_kept', 'lost_on_host')
      AND at < now() - make_interval(secs => :retention)
    ORDER BY at
    LIMIT :limit
),
removed AS (
    DELETE FROM image_archive_events AS e USING old WHERE e.ctid = old.ctid RETURNING 1
)
SELECT count(*) FROM removed;

-- name: release_audits
-- A batch judged nothing (the host seemed down): due again at once, for the next run.
UPDATE image_archive_audits
SET due_at = now()
WHERE record_id = ANY(CAST(:ids AS bigint[]));

-- name: pass_audits
-- Audit rows whose record is not archived now: a restore or a requeue under way (checked
-- once archived again: its success write makes it due), or a generation deleted (its
-- audit row goes).
WITH gone AS (
    DELETE FROM image_archive_audits AS a
    WHERE a.record_id = ANY(CAST(:ids AS bigint[]))
      AND NOT EXISTS (SELECT 1 FROM image_generation_records AS r WHERE r.id = a.record_id)
    RETURNING 1
)
UPDATE image_archive_audits
SET due_at = now() + make_interval(secs => :period)
WHERE record_id = ANY(CAST(:ids AS bigint[]));

-- name: keep_original
-- An original kept outside the archive path (lib.state.originals: the audit's GET of the
-- hosted file, or the provider's URL fetched again): added, or replacing the row's (the
-- older object stays in the versioned bucket), and told in the story.
WITH kept AS (
    INSERT INTO image_archive_originals AS kept
        (record_id, bucket, key, version_id, sha256, bytes, mime_type, source)
    VALUES (:record_id, :bucket, :key, CAST(:version_id AS text), :sha256,
            CAST(:bytes AS bigint), :mime_type, :source)
    {{original_replaces}}
    RETURNING record_id
)
INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
SELECT record_id, now(), 0, 0, 'original_kept',
       jsonb_build_object('source', CAST(:source AS text), 'key', CAST(:key AS text),
                          'bytes', CAST(:bytes AS bigint), 'by', CAST(:by AS text))
FROM kept
RETURNING record_id;

-- name: request_restores
-- Archive these records again, from their originals: each archived row whose hosted URL is
-- still the one judged (:urls, parallel to :ids; NULL: any) goes back to PENDING with a
-- fresh attempt budget, due now and stamped, keeping its hosted URL until the success
-- write replaces it; the restore is noted (what it replaces) and told in the story. A
-- record without an original, or not archived now, is left as it is.
WITH asked AS (
    SELECT a.id, a.url
    FROM unnest(CAST(:ids AS bigint[]), CAST(:urls AS text[])) AS a (id, url)
),
picked AS (
    SELECT r.id, r.hosted_image_url, r.hosted_response ->> 'key' AS old_key
    FROM image_generation_records AS r
    JOIN asked ON asked.id = r.id
    WHERE (r.archive_status = 'SUCCEEDED'
           -- A restore that failed (Lsky would have reused the damaged file, the original
           -- could not be read): tried again as it was asked.
           OR (r.archive_status = 'FAILED'
               AND EXISTS (SELECT 1 FROM image_archive_restores AS x WHERE x.record_id = r.id)))
      AND (asked.url IS NULL OR r.hosted_image_url IS NOT DISTINCT FROM asked.url)
      -- Without an original only when the caller checked the provider's URL still gives
      -- the bytes first sent (the auditor; or its restore is under way already): the
      -- archive then fetches it again from there.
      AND (NOT CAST(:need_original AS boolean)
           OR EXISTS (SELECT 1 FROM image_archive_originals AS o WHERE o.record_id = r.id)
           OR EXISTS (SELECT 1 FROM image_archive_restores AS x WHERE x.record_id = r.id))
    FOR UPDATE OF r SKIP LOCKED
),
marked AS (
    UPDATE image_generation_records AS r
    SET archive_status = 'PENDING',
        archive_attempts = 0,
        archive_error = NULL,
        archive_failed_at = NULL,
        archive_next_run_at = now(),
        archive_enqueued_at = now(),
        archive_locked_by = NULL,
        archive_locked_at = NULL,
        archive_may_be_hosted = false,
        archive_first_claimed_at = NULL,
        archive_wait_reason = NULL,
        archive_sent = NULL
    FROM picked
    WHERE r.id = picked.id
    RETURNING r.id, r.archive_enqueued_at
),
noted AS (
    INSERT INTO image_archive_restores AS x (record_id, reason, requested_by, old_url, old_key)
    SELECT picked.id, :reason, :by, picked.hosted_image_url, picked.old_key
    FROM picked JOIN marked USING (id)
    ON CONFLICT (record_id) DO UPDATE
    SET requested_at = now(), reason = EXCLUDED.reason, requested_by = EXCLUDED.requested_by,
        old_url = EXCLUDED.old_url, old_key = EXCLUDED.old_key
    RETURNING x.record_id
),
told AS (
    INSERT INTO image_archive_events (record_id, at, seq, attempt, kind, detail)
    SELECT picked.id, now(), 0, 0, 'enqueued',
           jsonb_build_object('by', CAST(:by AS text), 'restore', CAST(:reason AS text),
                              'replaces', picked.hosted_image_url)
    FROM picked JOIN marked USING (id)
)
SELECT marked.id, marked.archive_enqueued_at FROM marked ORDER BY marked.id;

-- name: audit_found
-- What the audit found wrong and is still so (`archive-ctl restore --missing/--altered`):
-- archived records whose last verdict is :verdict, by id after :after_id (its partial
-- index), with whether an original is kept.
SELECT a.record_id, a.checked_url, o.record_id IS NOT NULL, a.lost
FROM image_archive_audits AS a
JOIN image_generation_records AS r ON r.id = a.record_id
LEFT JOIN image_archive_originals AS o ON o.record_id = a.record_id
WHERE a.verdict = :verdict AND a.verdict <> 'intact' AND a.record_id > :after_id
  AND r.archive_status = 'SUCCEEDED'
ORDER BY a.record_id
LIMIT :limit;

-- name: restorable
-- The records an operator names (`archive-ctl restore --id`), as a restore would take
-- them: archived (or FAILED with a restore under way), and whether an original is kept.
SELECT asked.id, r.id IS NOT NULL, r.archive_status, o.record_id IS NOT NULL,
       x.record_id IS NOT NULL
FROM unnest(CAST(:ids AS bigint[])) AS asked (id)
LEFT JOIN image_generation_records AS r ON r.id = asked.id
LEFT JOIN image_archive_originals AS o ON o.record_id = asked.id
LEFT JOIN image_archive_restores AS x ON x.record_id = asked.id
ORDER BY asked.id;

-- name: audit_coverage
-- `archive-ctl status`: how far the audit and the originals cover the archive. One pass
-- over the audit table (a row per archived record, narrow), the originals joined by key.
SELECT count(*),
       count(*) FILTER (WHERE a.checked_at IS NULL),
       min(a.checked_at),
       count(*) FILTER (WHERE a.verdict = 'intact'),
       count(*) FILTER (WHERE a.verdict = 'missing'),
       count(*) FILTER (WHERE a.verdict = 'altered'),
       count(*) FILTER (WHERE a.lost),
       count(*) FILTER (WHERE a.unreachable_since IS NOT NULL),
       count(*) FILTER (WHERE a.due_at <= now()),
       EXTRACT(EPOCH FROM now() - min(a.due_at) FILTER (WHERE a.due_at <= now())),
       count(o.record_id),
       (SELECT count(*) FROM image_archive_restores),
       count(o.record_id) FILTER (WHERE NOT o.confirmed),
       EXTRACT(EPOCH FROM now() - min(o.kept_at) FILTER (WHERE NOT o.confirmed))
FROM image_archive_audits AS a
LEFT JOIN image_archive_originals AS o ON o.record_id = a.record_id;

-- name: record_keeping
-- `archive-ctl show`: the record's audit (last check, verdict, next).
SELECT a.checked_at, a.verdict, a.verdict_since, a.lost, a.due_at, a.unreachable_since
FROM (SELECT 1) AS one
LEFT JOIN image_archive_audits AS a ON a.record_id = :record_id;
