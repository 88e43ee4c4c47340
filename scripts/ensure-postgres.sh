#!/usr/bin/env bash
# Make sure PostgreSQL server binaries exist for the throwaway test cluster.
# Nothing to do when TEST_DATABASE_URL points at a server, or the binaries are there.
set -euo pipefail

if [[ -n "${TEST_DATABASE_URL:-}" ]]; then
  exit 0
fi
if command -v pg_config >/dev/null 2>&1 && [[ -x "$(pg_config --bindir)/initdb" ]]; then
  exit 0
fi
if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  exit 0
fi
if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
  echo "PostgreSQL server binaries not found: installing Debian's postgresql package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  exit 0
fi
cat >&2 <<'MSG'
PostgreSQL server binaries not found, and this script cannot install them.
Install PostgreSQL (e.g. `sudo apt-get install postgresql`, `brew install postgresql`)
or point the tests at a server with TEST_DATABASE_URL=postgresql://user:pass@host:port/db
MSG
exit 1
