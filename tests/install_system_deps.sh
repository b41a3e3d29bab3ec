#!/usr/bin/env bash
# System packages the test suite needs, on Debian/Ubuntu as root: Chromium (the dashboard test), tcmalloc
# (resources.cpu_allocator=tcmalloc), PostgreSQL (an Optuna storage behind a password) and a local SLURM
# cluster (launchers/slurm/local_cluster.sh; the tests start it with 2 nodes). Quick when everything is
# installed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

if ! command -v chromium >/dev/null 2>&1 || ! fc-list 2>/dev/null | grep -qi dejavu; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
if ! ldconfig -p | grep -q libtcmalloc_minimal; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4 >/dev/null
fi
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then  # an Optuna storage with a password (test_secrets.py)
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
bash "$here/../launchers/slurm/local_cluster.sh" install
