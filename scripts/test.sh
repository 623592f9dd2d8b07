#!/usr/bin/env bash
# Run every ketch test: formatting, clippy, the Rust unit and end-to-end
# tests, the Python / kcat client tests in tests/python, and the Docker
# Compose stack (scripts/compose-test.sh, which installs and starts Docker).
#
# Installs what the tests need when it is missing (redis-server and
# redis-tools, kcat, haproxy, openssl, postgresql, chromium and a C toolchain with apt-get;
# pytest, confluent-kafka, kafka-python, pyiceberg and psycopg2 with pip).
# Starts no shared Redis: every test starts its own redis-server (or Redis
# Cluster) on free ports. The suites that hold for either mode run a second
# time against a 3-master Redis Cluster (TEST_REDIS_MODE=cluster); those
# of the data path a third time against Valkey 8, a Redis 7.2+ server
# (unpacked from bookworm-backports).
# Respects CARGO_TARGET_DIR. Exits non-zero if any step fails.
set -uo pipefail

cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "test.sh: need root to run: $*  (no sudo available)" >&2
        return 1
    fi
}

# --- prerequisites --------------------------------------------------------

install_prerequisites() {
    local missing=()
    command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
    # redis-cli --cluster create/reshard for the Redis Cluster tests.
    command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
    # Test certificates for TLS to Redis.
    command -v openssl >/dev/null 2>&1 || missing+=(openssl)
    command -v kcat >/dev/null 2>&1 || missing+=(kcat)
    # The load-balancer tests put HAProxy in front of the gateways.
    command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
    # The tiering tests run a PostgreSQL catalog (initdb + postgres).
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
    # The web console is tested in headless Chromium (tests/tests/console.rs).
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    # rdkafka-sys compiles librdkafka (C, configure + make) for the Rust tests.
    if ! command -v cc >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
        missing+=(build-essential)
    fi
    # The Python tests' modules are installed with pip (Debian's python3
    # comes without it).
    python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${missing[*]} with apt-get"
        as_root apt-get update || return 1
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" || return 1
    fi

    local modules=()
    python3 -c 'import pytest' 2>/dev/null || modules+=(pytest)
    python3 -c 'import confluent_kafka' 2>/dev/null || modules+=(confluent-kafka)
    python3 -c 'import kafka' 2>/dev/null || modules+=(kafka-python)
    # The tiering tests read the Iceberg tables with pyiceberg (SQL catalog on
    # SQLite and PostgreSQL, pyarrow for S3 and local files).
    python3 -c 'import pyiceberg.catalog.sql, pyarrow, sqlalchemy' 2>/dev/null || modules+=('pyiceberg[sql-sqlite,pyarrow]')
    python3 -c 'import psycopg2' 2>/dev/null || modules+=(psycopg2-binary)
    if [ "${#modules[@]}" -gt 0 ]; then
        log "installing ${modules[*]} with pip"
        if ! python3 -m pip install -q "${modules[@]}"; then
            # Debian's python refuses system-wide installs (PEP 668) without this.
            python3 -m pip install -q --break-system-packages "${modules[@]}" || return 1
        fi
    fi
}

# Valkey 8 (bookworm-backports; a fork of Redis 7.2), for the suites that
# run again on a newer server than bookworm's redis-server 7.0: Redis 7.2
# changed commands ketch uses (XSETID refuses an id below the largest one
# deleted; WAITAOF exists). Unpacked under the target directory (no system
# apt source is added: the download reads a sources list of its own), once.
install_valkey() {
    if [ -x "$VALKEY_SERVER" ]; then
        echo "already unpacked: $VALKEY_SERVER"
        return 0
    fi
    local dir="$target_dir/valkey"
    rm -rf "$dir"
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/debs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main" \
        > "$dir/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache")
    apt-get "${opts[@]}" update || return 1
    (cd "$dir/debs" && apt-get "${opts[@]}" download valkey-server valkey-tools) || return 1
    local deb
    for deb in "$dir"/debs/*.deb; do
        dpkg -x "$deb" "$dir/root" || return 1
    done
    # Its libraries, from bookworm itself.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y libjemalloc2 liblzf1 || return 1
    "$VALKEY_SERVER" --version
}

# Builds the upgrade base's `ketch` in a temporary worktree, once per
# target directory. It shares this target directory (its dependencies are
# this tree's), and its workspace crates are named like this tree's, so
# this tree's sources are touched afterwards: cargo then rebuilds them
# instead of taking the base's artifacts as up to date.
build_upgrade_base() {
    if [ -x "$KETCH_UPGRADE_BASE_BIN" ]; then
        echo "already built: $KETCH_UPGRADE_BASE_BIN"
        return 0
    fi
    if ! git cat-file -e "$upgrade_base_commit^{commit}" 2>/dev/null; then
        echo "commit $upgrade_base_commit (scripts/upgrade-base) is not in this clone's history" >&2
        return 1
    fi
    local tree status=0
    tree=$(mktemp -d)
    git worktree add --detach "$tree" "$upgrade_base_commit" >/dev/null || return 1
    (cd "$tree" && CARGO_TARGET_DIR="$target_dir" cargo build -p ketch-gateway) || status=1
    if [ "$status" -eq 0 ]; then
        mkdir -p "$(dirname "$KETCH_UPGRADE_BASE_BIN")"
        cp "$target_dir/debug/ketch" "$KETCH_UPGRADE_BASE_BIN" || status=1
    fi
    git worktree remove --force "$tree"
    find config storage tiering gateway tests benchmark -type f \( -name '*.rs' -o -name '*.lua' \) \
        -exec touch {} +
    return "$status"
}

# --- steps ----------------------------------------------------------------

# The binary `cargo build` makes; the Rust and Python end-to-end tests run it.
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in
    /*) ;;
    *) target_dir="$PWD/$target_dir" ;;
esac
export KETCH_BIN="$target_dir/debug/ketch"

# The previous release, which tests/tests/upgrade.rs upgrades from.
upgrade_base_commit=$(grep -v '^#' scripts/upgrade-base | head -n 1)
export KETCH_UPGRADE_BASE_BIN="$target_dir/upgrade-base/ketch-$upgrade_base_commit"

export VALKEY_SERVER="$target_dir/valkey/root/usr/bin/valkey-server"

# End-to-end suites written against TestRedis, which hold in both modes
# (run with --workspace: the same features, so nothing is built again).
cluster_suites=(roundtrip compression produce_fetch membership multi_gateway list_offsets offsets
    idempotence admin admin_apis retention tiering load_balancer security observability transactions topic_configs compaction
    quotas tail)
# The suites of the data path, run again on Valkey 8 (a Redis 7.2+ server).
valkey_suites=(roundtrip compression produce_fetch idempotence durability retention compaction tail offsets
    transactions)

results=()
failed=0

# A TCP port nothing listens on now (for the compose stack's load balancer,
# so a ketch already running on 9092 does not collide with it).
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

step() {
    local name="$1"
    shift
    log "$name"
    local start=$SECONDS
    if "$@"; then
        results+=("ok    $name ($((SECONDS - start))s)")
    else
        results+=("FAIL  $name ($((SECONDS - start))s)")
        failed=1
    fi
}

skip() {
    results+=("skip  $1 (no ketch binary built: $KETCH_BIN)")
}

step "install prerequisites" install_prerequisites
step "unpack Valkey 8 (bookworm-backports)" install_valkey
step "build the upgrade base (ketch at $upgrade_base_commit)" build_upgrade_base
step "cargo fmt --all --check" cargo fmt --all --check
step "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings
step "cargo build -p ketch-gateway -p ketch-bench" cargo build -p ketch-gateway -p ketch-bench
# The end-to-end tests need a binary built from this tree, not a stale one.
if [[ "${results[-1]}" == ok* ]] && [ -x "$KETCH_BIN" ]; then
    step "cargo test --workspace" cargo test --workspace --no-fail-fast -- --test-threads=2
    step "end-to-end suites again on a Redis Cluster (TEST_REDIS_MODE=cluster)" \
        env TEST_REDIS_MODE=cluster cargo test --workspace --no-fail-fast \
        "${cluster_suites[@]/#/--test=}" -- --test-threads=2
    step "data-path suites again on Valkey 8, a Redis 7.2+ server (REDIS_SERVER=valkey-server)" \
        env REDIS_SERVER="$VALKEY_SERVER" cargo test --workspace --no-fail-fast \
        "${valkey_suites[@]/#/--test=}" -- --test-threads=2
    step "python and kcat tests (pytest tests/python)" python3 -m pytest -q tests/python
    # Docker: installs docker.io and docker-compose, starts (and stops) dockerd,
    # builds stand-in images from Debian packages and puts this KETCH_BIN in the image.
    step "docker compose stack (scripts/compose-test.sh)" \
        as_root env KETCH_BIN="$KETCH_BIN" COMPOSE_TEST_KAFKA_PORT="$(free_port)" bash scripts/compose-test.sh
else
    failed=1
    skip "cargo test --workspace"
    skip "end-to-end suites again on a Redis Cluster (TEST_REDIS_MODE=cluster)"
    skip "data-path suites again on Valkey 8, a Redis 7.2+ server (REDIS_SERVER=valkey-server)"
    skip "python and kcat tests (pytest tests/python)"
    skip "docker compose stack (scripts/compose-test.sh)"
fi

printf '\n==> summary (KETCH_BIN=%s)\n' "$KETCH_BIN"
printf '    %s\n' "${results[@]}"
if [ "$failed" -ne 0 ]; then
    printf '\nFAILED\n'
    exit 1
fi
printf '\nall tests passed\n'
