#!/usr/bin/env bash
# Run ketch locally against a Redis on this machine.
#
# If no Redis answers at the URL ketch will use (--redis-url, else
# $KETCH_REDIS_URL, else redis://127.0.0.1:6379), installs redis-server with
# apt-get when it is absent and starts it daemonized on 127.0.0.1 (port 6379
# unless the URL names another). Then builds and runs `ketch serve` in release
# mode; arguments are passed on to `ketch serve` (e.g. --listen 0.0.0.0:9093).
#
# ketch needs Redis >= 7.0 (sharded pub/sub: SPUBLISH/SSUBSCRIBE).
set -euo pipefail

cd "$(dirname "$0")/.."

log() { printf 'run-local: %s\n' "$*" >&2; }

# Runs a command as root: directly when we are root, through sudo otherwise.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        log "need root to run: $*  (no sudo available)"
        exit 1
    fi
}

# The Redis URL ketch will use: --redis-url from the arguments, else
# $KETCH_REDIS_URL, else the default.
redis_url="${KETCH_REDIS_URL:-redis://127.0.0.1:6379}"
args=("$@")
for i in "${!args[@]}"; do
    case "${args[$i]}" in
        --redis-url=*) redis_url="${args[$i]#--redis-url=}" ;;
        --redis-url) redis_url="${args[$((i + 1))]:-$redis_url}" ;;
    esac
done

# Its host and port: redis[s]://[user:password@]host:port[/db]
hostport="${redis_url#*://}"
hostport="${hostport##*@}"
hostport="${hostport%%/*}"
redis_host="${hostport%:*}"
redis_port="${hostport##*:}"
if [ "$redis_host" = "$hostport" ]; then
    redis_port=6379
fi
redis_host="${redis_host:-127.0.0.1}"
redis_host="${redis_host#[}"
redis_host="${redis_host%]}"

redis_answers() {
    if command -v redis-cli >/dev/null 2>&1; then
        # -u keeps credentials and TLS from the URL.
        [ "$(redis-cli -u "$redis_url" ping 2>/dev/null)" = "PONG" ]
    else
        # No client: a plain PING over bash's /dev/tcp (no AUTH, no TLS).
        (
            exec 3<>"/dev/tcp/$redis_host/$redis_port" || exit 1
            printf 'PING\r\n' >&3
            IFS= read -r -t 2 reply <&3 || exit 1
            case "$reply" in
                +PONG*|-NOAUTH*) exit 0 ;;
                *) exit 1 ;;
            esac
        ) 2>/dev/null
    fi
}

if redis_answers; then
    log "Redis answers at $redis_host:$redis_port"
else
    case "$redis_host" in
        127.0.0.1|localhost|::1) ;;
        *)
            log "no Redis answers at $redis_url, and it is not on this machine: start it there, or point ketch at another Redis"
            exit 1
            ;;
    esac
    if ! command -v redis-server >/dev/null 2>&1; then
        log "redis-server not found; installing it with apt-get"
        as_root apt-get update
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server
    fi
    log "starting redis-server on 127.0.0.1:$redis_port"
    redis-server --daemonize yes --port "$redis_port" --bind 127.0.0.1
    for _ in $(seq 1 50); do
        redis_answers && break
        sleep 0.1
    done
    if ! redis_answers; then
        log "redis-server did not answer on 127.0.0.1:$redis_port"
        exit 1
    fi
    log "Redis is up"
fi

version="$(redis-cli -u "$redis_url" info server 2>/dev/null | sed -n 's/^redis_version:\([0-9]*\).*/\1/p' | tr -d '\r' || true)"
if [ -n "$version" ] && [ "$version" -lt 7 ]; then
    log "Redis $version is too old: ketch needs Redis >= 7.0 (sharded pub/sub)"
    exit 1
fi

# The build compiles C (jemalloc, SQLite, zstd).
if ! command -v cc >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
    log "no C toolchain found; installing build-essential with apt-get"
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y build-essential
fi

exec cargo run --release -p ketch-gateway --bin ketch -- serve "$@"
