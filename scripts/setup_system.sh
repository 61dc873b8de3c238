#!/usr/bin/env bash
# The Debian packages the test-suite drives, installed with apt-get where they are missing (as root, or with sudo);
# without apt-get a warning says which tests will skip or fail. Called by scripts/test.sh (and so by .ci/run).
#   postgresql          the metadata-store tests start their own server (tests/server/test_store_postgres.py); skip without
#   chromium(-driver)   the console's browser tests (Playwright drives /usr/bin/chromium); skip without
#   bubblewrap          the agentic tool sandbox (every sandboxed tool call runs under bwrap); ToolManager refuses
#                       sandboxed tools without it, so the tool tests fail
set -euo pipefail
missing=()
if ! command -v pg_ctl >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  missing+=(postgresql)
fi
command -v chromium >/dev/null 2>&1 || missing+=(chromium chromium-driver)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[setup] warning: no apt-get to install ${missing[*]}: their tests skip (bubblewrap: the tool tests fail)" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "[setup] installing Debian packages: ${missing[*]}"
log=$(mktemp)
if ! { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "[setup] failed: apt-get install ${missing[*]}" >&2
  exit 1
fi
rm -f "$log"
