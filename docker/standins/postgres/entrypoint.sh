#!/bin/bash
# The part of the official postgres image's entrypoint the compose stack
# uses: on an empty PGDATA, initdb with POSTGRES_USER (default postgres) and
# POSTGRES_PASSWORD, password authentication from any address, and
# POSTGRES_DB created; then the server in the foreground, as user postgres.
set -euo pipefail
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec runuser -u postgres -- "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
        pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
        psql -v ON_ERROR_STOP=1 -U "$user" -d postgres -q -c "CREATE DATABASE \"$db\""
        pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    fi
    echo "postgres-entrypoint: initialized $PGDATA (user $user, database $db)"
fi
if [ "${1:-}" = postgres ]; then
    shift
    exec postgres -D "$PGDATA" "$@"
fi
exec "$@"
