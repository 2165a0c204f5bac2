#!/usr/bin/env bash
# A throwaway PostgreSQL server for the budget registry's tests and benchmark: installs PostgreSQL from Debian's
# packages when it is missing, starts a private cluster on a free port of 127.0.0.1 with its data in DIR (default: a
# new temporary folder) and prints the registry URL on stdout.
#   export LIGHTNING_DP_TEST_POSTGRES=$(bash scripts/postgres.sh start DIR)
#   bash scripts/postgres.sh stop DIR
set -euo pipefail
say() { echo "postgres.sh: $*" >&2; }
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
as_owner() {  # initdb and postgres refuse to run as root
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
if [ "${1:-}" = stop ]; then
  as_owner "$(pg_bin)/pg_ctl" -D "$2/data" -m fast stop >&2 || true
  rm -rf "$2"
  exit 0
fi
if [ -z "$(pg_bin)" ]; then
  [ "$(id -u)" = 0 ] || { say "PostgreSQL is not installed; run as root or: sudo apt-get install postgresql"; exit 1; }
  say "installing PostgreSQL (Debian's postgresql package)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends postgresql >&2
fi
BIN=$(pg_bin)
DIR=${2:-$(mktemp -d /tmp/ldp-postgres.XXXXXX)}
mkdir -p "$DIR"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
[ "$(id -u)" = 0 ] && chown postgres "$DIR"
as_owner "$BIN/initdb" -D "$DIR/data" -U ldp -A trust --no-sync >"$DIR/initdb.log" 2>&1 \
  || { cat "$DIR/initdb.log" >&2; exit 1; }
as_owner "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
  -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c max_connections=100" start >&2 \
  || { cat "$DIR/server.log" >&2; exit 1; }
as_owner "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U ldp ldp_budget >&2
say "server in $DIR (stop: bash scripts/postgres.sh stop $DIR)"
echo "postgresql://ldp@127.0.0.1:$PORT/ldp_budget"
