// Runs the TypeScript producer of docs/how-to/connect-the-generation-service.md as an application would: the test
// writes the doc's block beside this file as imageArchive.ts, then runs
// `tsx enqueue.ts ID...` with DATABASE_URL and ARCHIVE_QUEUE_URL set.
import pg from "pg";
import { enqueueImageArchive } from "./imageArchive";

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
try {
  for (const id of process.argv.slice(2)) await enqueueImageArchive(pool, id);
} finally {
  await pool.end();
}
