#!/usr/bin/env bash
# Make sure Node.js 20+ and npm exist: the tests type-check and run the TypeScript producer
# of docs/how-to/connect-the-generation-service.md (tests/producer_ts). AWS's SDK for JavaScript needs Node.js 20.
set -euo pipefail

if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  major="$(node -p 'process.versions.node.split(".")[0]')"
  if (( major >= 20 )); then
    exit 0
  fi
  echo "Node.js $(node --version) found; the tests need Node.js 20 or later" >&2
else
  echo "Node.js and npm not found; the tests need Node.js 20 or later" >&2
fi
cat >&2 <<'MSG'
Install Node.js 20 or later with npm (https://nodejs.org, your system's packages, or nvm),
then run `make test` again. Only the TypeScript producer's tests use it.
MSG
exit 1
