#!/usr/bin/env bash
# Install (from Debian's packages) and start PostgreSQL and Redis for the tests, on
# loopback only, without systemd. Idempotent and quick when they already run.
# Prints the environment the tests read (CORRAL_TEST_POSTGRES_URL, CORRAL_TEST_REDIS_URL).
set -euo pipefail

DIR=${CORRAL_SERVICES_DIR:-/var/tmp/corral-services}
PG_PORT=${CORRAL_TEST_PG_PORT:-5499}
REDIS_PORT=${CORRAL_TEST_REDIS_PORT:-6399}
log() { echo "services: $*" >&2; }

need=()
command -v redis-server >/dev/null || need+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$DIR"

# --- Redis -----------------------------------------------------------------------------
if ! redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  log "starting redis on 127.0.0.1:$REDIS_PORT"
  mkdir -p "$DIR/redis"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$DIR/redis" --daemonize yes --logfile "$DIR/redis/redis.log" \
    --pidfile "$DIR/redis/redis.pid" >/dev/null
  for _ in $(seq 100); do
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.05
  done
  redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null
fi

# --- PostgreSQL ------------------------------------------------------------------------
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
PG_DIR="$DIR/pg"
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$*"; else sh -c "$*"; fi; }
if ! "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; then
  install -d -m 0700 "$PG_DIR"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$PG_DIR"
  if [ ! -f "$PG_DIR/data/PG_VERSION" ]; then
    log "initdb in $PG_DIR"
    as_pg "'$PG_BIN/initdb' -D '$PG_DIR/data' -A trust -U postgres --no-sync >/dev/null"
  fi
  log "starting postgresql on 127.0.0.1:$PG_PORT"
  as_pg "'$PG_BIN/pg_ctl' -D '$PG_DIR/data' -l '$PG_DIR/log' -w -o \"-p $PG_PORT -k '$PG_DIR' -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300\" start >/dev/null"
fi

echo "CORRAL_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
echo "CORRAL_TEST_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/${CORRAL_TEST_REDIS_DB:-0}"
