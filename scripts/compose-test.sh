#!/usr/bin/env bash
# End-to-end test of the Docker Compose stack (docker-compose.yml): three
# gateways behind HAProxy, Redis, the S3 object store and the PostgreSQL
# Iceberg catalog, Prometheus, and the query service.
#
#   scripts/compose-test.sh            (as root; CI runs it from scripts/test.sh)
#
# What it does:
#   1. installs what is missing with apt-get (docker.io, docker-compose 1.29,
#      mmdebstrap, kcat, curl) and confluent-kafka and PyYAML with pip;
#   2. starts dockerd when no Docker daemon answers (and stops it at exit);
#   3. builds every image locally, since no image registry is reachable: a
#      Debian base made with mmdebstrap (`ketch-test/debian:<codename>`,
#      reused while its inputs are unchanged), stand-ins for Redis,
#      PostgreSQL, HAProxy, Prometheus and Python from Debian packages
#      (docker/standins/), the object store from the repository's ketch-s3,
#      the ketch image from an already built binary (the Dockerfile's
#      `prebuilt` target) and the query image (docker/query);
#   4. checks the ketch image, the Dockerfile's default target (with a
#      stand-in Rust toolchain: stage order, .dockerignore, paths; not the
#      compilation), the compose files (docker-compose config) and Grafana's
#      provisioning and dashboard (Grafana itself has no Debian package and
#      is not started; neither is MinIO, replaced by ketch-s3 through
#      docker/compose-test.override.yml);
#   5. brings the stack up (all but Grafana), then through the load
#      balancer on localhost: creates a 6-partition topic that archives to
#      Iceberg, produces 1000 records with kcat, consumes them with a
#      consumer group (confluent-kafka) and commits, waits until the archive
#      holds every record (the query service), checks Prometheus scrapes
#      every gateway and has every metric the dashboard uses, and that
#      Metadata lists exactly one broker (the load balancer);
#   6. tears the stack down (docker-compose down -v) however it ends, and
#      prints the containers' logs when a check failed.
#
# Environment:
#   KETCH_BIN     the ketch binary to put in the image (default:
#                 $CARGO_TARGET_DIR/debug/ketch, else
#                 /var/tmp/ketch-ci-target/debug/ketch, else target/debug/ketch).
#                 It must run on this machine's Debian release: the image's
#                 base is made from the same release. ketch-s3 is taken from
#                 beside it (cargo build -p ketch-bench builds it).
#   COMPOSE_TEST_PROJECT      the compose project name (ketch-compose-test)
#   COMPOSE_TEST_KAFKA_PORT   the load balancer's port on this machine (9092)
#   COMPOSE_TEST_FILES        more compose files to layer on top, separated by ':'
#   COMPOSE_TEST_REDIS=cluster   run the gateways on the `cluster` profile's
#                 3-master Redis Cluster instead of the single Redis server,
#                 and check that the topic's partitions are spread over it
#   COMPOSE_TEST_KEEP=1       leave the stack running at the end (for debugging)
#
# Exits non-zero when anything fails, naming what.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
started_at=$SECONDS

log() { printf '\n==> compose-test: %s (%ss)\n' "$*" "$((SECONDS - started_at))" >&2; }
note() { printf 'compose-test: %s\n' "$*" >&2; }
die() {
    printf '\ncompose-test: FAILED: %s\n' "$*" >&2
    failed=1
    exit 1
}

if [ "$(id -u)" -ne 0 ]; then
    echo "compose-test: run as root (it installs packages and may start dockerd)" >&2
    exit 1
fi

project="${COMPOSE_TEST_PROJECT:-ketch-compose-test}"
redis_mode="${COMPOSE_TEST_REDIS:-single}"
case "$redis_mode" in
    single | cluster) ;;
    *) echo "compose-test: COMPOSE_TEST_REDIS is single or cluster, not $redis_mode" >&2; exit 2 ;;
esac
kafka_port="${COMPOSE_TEST_KAFKA_PORT:-9092}"
bootstrap="localhost:$kafka_port"
if [ -z "${KETCH_BIN:-}" ]; then
    if [ -n "${CARGO_TARGET_DIR:-}" ]; then
        KETCH_BIN="$CARGO_TARGET_DIR/debug/ketch"
    elif [ -x /var/tmp/ketch-ci-target/debug/ketch ]; then
        KETCH_BIN=/var/tmp/ketch-ci-target/debug/ketch
    else
        KETCH_BIN="$root/target/debug/ketch"
    fi
fi
ketch_s3_bin="$(dirname "$KETCH_BIN")/ketch-s3"

work=$(mktemp -d /tmp/ketch-compose-test.XXXXXX)
dockerd_pid=""
stack_up=0
failed=0
checks=()

# --- cleanup ------------------------------------------------------------------

cleanup() {
    local status=$?
    [ "$status" -ne 0 ] && failed=1
    set +e
    if [ "$stack_up" -eq 1 ]; then
        if [ "$failed" -ne 0 ]; then
            printf '\n==> compose-test: containers\n' >&2
            compose ps >&2
            printf '\n==> compose-test: container logs (last 150 lines each)\n' >&2
            compose logs --no-color --tail=150 >&2
        fi
        if [ "${COMPOSE_TEST_KEEP:-0}" = 1 ]; then
            note "COMPOSE_TEST_KEEP=1: the stack stays up (project $project; down with: docker-compose -p $project down -v)"
        else
            log "tearing the stack down"
            compose --profile cluster --profile tools down -v --remove-orphans --timeout 10 \
                >"$work/down.log" 2>&1 || cat "$work/down.log" >&2
        fi
    fi
    if [ -n "$dockerd_pid" ] && [ "${COMPOSE_TEST_KEEP:-0}" != 1 ]; then
        log "stopping the dockerd this test started"
        kill -TERM "$dockerd_pid" 2>/dev/null
        for _ in $(seq 1 60); do
            kill -0 "$dockerd_pid" 2>/dev/null || break
            sleep 0.5
        done
        if kill -0 "$dockerd_pid" 2>/dev/null; then
            note "dockerd did not stop in 30 s; killing it"
            kill -KILL "$dockerd_pid" 2>/dev/null
        fi
        if [ "$failed" -ne 0 ]; then
            printf '\n==> compose-test: dockerd log (last 40 lines)\n' >&2
            tail -n 40 "$work/dockerd.log" >&2
        fi
    fi
    rm -rf "$work"
    if [ "${#checks[@]}" -gt 0 ]; then
        printf '\n==> compose-test: checks\n' >&2
        printf '    %s\n' "${checks[@]}" >&2
    fi
    if [ "$failed" -ne 0 ]; then
        printf '\ncompose-test: FAILED after %ss\n' "$((SECONDS - started_at))" >&2
        exit 1
    fi
    printf '\ncompose-test: every check passed in %ss\n' "$((SECONDS - started_at))" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- prerequisites ------------------------------------------------------------

install_prerequisites() {
    local missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    command -v docker >/dev/null 2>&1 || missing+=(docker.io)
    command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
    command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
    command -v kcat >/dev/null 2>&1 || missing+=(kcat)
    command -v curl >/dev/null 2>&1 || missing+=(curl)
    command -v iptables >/dev/null 2>&1 || missing+=(iptables)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${missing[*]} with apt-get"
        apt-get update -q >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; return 1; }
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}" >>"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; return 1; }
    fi
    if ! python3 -c 'import confluent_kafka, yaml' 2>/dev/null; then
        log "installing confluent-kafka and PyYAML with pip"
        python3 -m pip install -q confluent-kafka PyYAML \
            || python3 -m pip install -q --break-system-packages confluent-kafka PyYAML
    fi
}

# --- the Docker daemon --------------------------------------------------------

start_docker() {
    if docker info >/dev/null 2>&1; then
        note "using the running Docker daemon"
        return 0
    fi
    log "starting dockerd (no Docker daemon answers)"
    dockerd >"$work/dockerd.log" 2>&1 &
    dockerd_pid=$!
    local deadline=$((SECONDS + 60))
    until docker info >/dev/null 2>&1; do
        if ! kill -0 "$dockerd_pid" 2>/dev/null; then
            tail -n 40 "$work/dockerd.log" >&2
            dockerd_pid=""
            die "dockerd exited at start"
        fi
        [ "$SECONDS" -lt "$deadline" ] || { tail -n 40 "$work/dockerd.log" >&2; die "dockerd does not answer after 60 s"; }
        sleep 0.5
    done
}

# --- images -------------------------------------------------------------------

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
base_image="ketch-test/debian:$codename"

# The host's Debian sources for this release (so the base uses the same
# mirror); files that name another release or a key the base lacks are left
# out. None: mmdebstrap's default mirror.
host_debian_sources() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        grep -Eq "^[[:space:]]*(deb[[:space:]].*|Suites:.*)[[:space:]]${codename}(-[a-z]+)?([[:space:]]|\$)" "$f" || continue
        if grep -Eio 'signed-by[=:][[:space:]]*[^] ]+' "$f" | grep -vq debian-archive-keyring; then
            continue
        fi
        echo "$f"
    done
}

# What makes the base: the host's sources, apt proxy, CA certificates (an
# egress proxy's CA, say) and pip settings, so that apt-get and pip inside
# `docker build --network host` work as they do on the host.
prepare_base_inputs() {
    mkdir -p "$work/base/ca"
    base_sources=()
    mapfile -t base_sources < <(host_debian_sources)
    base_aptopts=()
    local line
    while IFS= read -r line; do
        base_aptopts+=(--aptopt="$line")
    done < <(apt-config dump 2>/dev/null | grep -E '^Acquire::(http|https|ftp)::Proxy' || true)
    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$work/base/ca/"
    fi
    # pip's settings (files and PIP_* variables), without the host's local
    # paths; the certificate bundle becomes the base's own, which holds the
    # certificates above.
    {
        echo "[global]"
        python3 -m pip config list 2>/dev/null \
            | sed -n "s/^\(global\|:env:\)\.\([a-z-]*\)='\(.*\)'\$/\2 = \3/p" \
            | grep -Ev '^(find-links|no-index|disable-pip-version-check|cert|client-cert|target|prefix|user|root) ' || true
        echo "cert = /etc/ssl/certs/ca-certificates.crt"
        echo "disable-pip-version-check = true"
    } >"$work/base/pip.conf"
    local cert
    cert=$(python3 -m pip config list 2>/dev/null | sed -n "s/^\(global\|:env:\)\.cert='\(.*\)'\$/\2/p" | head -n 1)
    if [ -n "$cert" ] && [ -f "$cert" ] && [ "$cert" != /etc/ssl/certs/ca-certificates.crt ]; then
        cp "$cert" "$work/base/ca/pip-cert.crt"
    fi
    base_hash=$(
        {
            echo "ketch-test base v1 $codename"
            for f in "${base_sources[@]}"; do cat "$f"; done
            printf '%s\n' "${base_aptopts[@]}"
            cat "$work/base/pip.conf"
            cat "$work/base/ca/"* 2>/dev/null || true
        } | sha256sum | cut -c1-16
    )
}

build_base() {
    prepare_base_inputs
    local have
    have=$(docker image inspect -f '{{ index .Config.Labels "ketch-test.inputs" }}' "$base_image" 2>/dev/null || true)
    if [ "$have" = "$base_hash" ]; then
        note "reusing $base_image (inputs $base_hash)"
        return 0
    fi
    log "making $base_image with mmdebstrap (${base_sources[*]:-default mirror})"
    mmdebstrap --variant=minbase --include=ca-certificates \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
        --aptopt='Acquire::Languages "none"' --aptopt='APT::Install-Recommends "false"' "${base_aptopts[@]}" \
        --customize-hook="cp $work/base/ca/. \"\$1/usr/local/share/ca-certificates/\" -r" \
        --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
        --customize-hook="cp $work/base/pip.conf \"\$1/etc/pip.conf\"" \
        "$codename" "$work/base.tar" "${base_sources[@]}" >"$work/mmdebstrap.log" 2>&1 \
        || { tail -n 40 "$work/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
    docker import --change "LABEL ketch-test.inputs=$base_hash" --change 'CMD ["bash"]' \
        "$work/base.tar" "$base_image" >/dev/null
    rm -f "$work/base.tar"
}

proxy_build_args=()
for var in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    [ -n "${!var:-}" ] && proxy_build_args+=(--build-arg "$var")
done

# docker_build TAG CONTEXT [ARGS...]: the classic builder's layer cache makes
# an unchanged image a cache hit.
docker_build() {
    local tag="$1" context="$2"
    shift 2
    local logfile
    logfile="$work/build-${tag//[\/:]/_}.log"
    if ! docker build --network host "${proxy_build_args[@]}" --label ketch-test.image=1 -t "$tag" "$@" "$context" \
        >"$logfile" 2>&1; then
        tail -n 60 "$logfile" >&2
        die "docker build of $tag failed"
    fi
}

build_images() {
    build_base
    log "building the stand-in images (docker/standins)"
    local name
    for name in redis postgres haproxy prometheus python; do
        docker_build "ketch-test/$name" "docker/standins/$name" --build-arg "BASE_IMAGE=$base_image"
    done

    log "building ketch-test/s3 from $ketch_s3_bin"
    [ -x "$ketch_s3_bin" ] || die "no ketch-s3 binary at $ketch_s3_bin (cargo build -p ketch-bench builds it)"
    mkdir -p "$work/s3"
    cp docker/standins/s3/Dockerfile "$work/s3/"
    strip --strip-debug -o "$work/s3/ketch-s3" "$ketch_s3_bin" 2>/dev/null || cp "$ketch_s3_bin" "$work/s3/ketch-s3"
    docker_build ketch-test/s3 "$work/s3" --build-arg "BASE_IMAGE=$base_image"

    log "building ketch-test/ketch from $KETCH_BIN (Dockerfile, target prebuilt)"
    [ -x "$KETCH_BIN" ] || die "no ketch binary at $KETCH_BIN (set KETCH_BIN, or cargo build -p ketch-gateway)"
    mkdir -p "$work/ketch/docker"
    cp Dockerfile "$work/ketch/"
    cp docker/ketch-healthcheck "$work/ketch/docker/"
    strip --strip-debug -o "$work/ketch/ketch" "$KETCH_BIN" 2>/dev/null || cp "$KETCH_BIN" "$work/ketch/ketch"
    docker_build ketch-test/ketch "$work/ketch" --target prebuilt --build-arg "RUNTIME_IMAGE=$base_image"

    log "building ketch-test/query (docker/query)"
    docker_build ketch-test/query docker/query --build-arg PYTHON_IMAGE=ketch-test/python
    # The images these builds replaced.
    docker image prune -f --filter label=ketch-test.image=1 >/dev/null 2>&1 || true
}

check_ketch_image() {
    docker run --rm ketch-test/ketch --version || return 1
    local got want="ketch|9092/tcp 9644/tcp |[CMD ketch-healthcheck]|[ketch]|[serve]"
    got=$(docker inspect -f '{{.Config.User}}|{{range $p, $_ := .Config.ExposedPorts}}{{$p}} {{end}}|{{.Config.Healthcheck.Test}}|{{.Config.Entrypoint}}|{{.Config.Cmd}}' ketch-test/ketch)
    [ "$got" = "$want" ] || { note "image config: $got; expected $want"; return 1; }
    [ "$(docker run --rm --entrypoint id ketch-test/ketch -u)" != 0 ] || { note "the image runs as root"; return 1; }
}

# --- compose --------------------------------------------------------------------

compose_files=(-f docker-compose.yml -f docker/compose-test.override.yml)
if [ -n "${COMPOSE_TEST_FILES:-}" ]; then
    IFS=: read -r -a extra_files <<<"$COMPOSE_TEST_FILES"
    for f in "${extra_files[@]}"; do compose_files+=(-f "$f"); done
fi
# The image variables go to docker-compose only: ketch itself refuses
# KETCH_* variables that are not its settings.
compose_env=(
    KETCH_IMAGE=ketch-test/ketch
    KETCH_REDIS_IMAGE=ketch-test/redis
    KETCH_POSTGRES_IMAGE=ketch-test/postgres
    KETCH_MINIO_IMAGE=ketch-test/s3
    KETCH_MC_IMAGE=ketch-test/s3
    KETCH_HAPROXY_IMAGE=ketch-test/haproxy
    KETCH_PROMETHEUS_IMAGE=ketch-test/prometheus
    KETCH_QUERY_IMAGE=ketch-test/query
    KETCH_KAFKA_PORT="$kafka_port"
)
if [ "$redis_mode" = cluster ]; then
    # As docker-compose.yml's comments tell users to.
    # shellcheck disable=SC2054 # the commas are in a value
    compose_env+=(
        COMPOSE_PROFILES=cluster
        KETCH_REDIS_MODE=cluster
        KETCH_REDIS_URL=redis://redis-c1:6379,redis://redis-c2:6379,redis://redis-c3:6379
    )
fi
compose() {
    # The stack's own Redis, whatever a developer exported for
    # scripts/run-local.sh (docker-compose.yml reads these).
    env -u KETCH_REDIS_URL -u KETCH_REDIS_MODE -u KETCH_KAFKA_HOST \
        "${compose_env[@]}" docker-compose -p "$project" "${compose_files[@]}" "$@"
}

# check NAME COMMAND...: runs one check, records its result, stops the test
# at the first failure.
check() {
    local name="$1"
    shift
    log "check: $name"
    local start=$SECONDS
    if "$@"; then
        checks+=("ok    $name ($((SECONDS - start))s)")
    else
        checks+=("FAIL  $name ($((SECONDS - start))s)")
        die "$name"
    fi
}

check_compose_config() {
    docker-compose -f docker-compose.yml config -q || return 1
    docker-compose -f docker-compose.yml --profile cluster --profile tools config -q || return 1
    compose config -q || return 1
    local services
    services=$(docker-compose -f docker-compose.yml --profile cluster --profile tools config --services | sort | tr '\n' ' ')
    local want="gateway-1 gateway-2 gateway-3 grafana haproxy minio minio-init postgres prometheus query redis redis-c1 redis-c2 redis-c3 redis-cluster-init "
    [ "$services" = "$want" ] || { note "services: $services; expected: $want"; return 1; }
    # No gateway is given a node id: each claims one.
    if docker-compose -f docker-compose.yml config | grep -q KETCH_BROKER_ID; then
        note "a gateway sets KETCH_BROKER_ID"
        return 1
    fi
}

check_grafana_files() {
    METRICS_OUT="$work/dashboard-metrics.txt" python3 - "$root/docker" <<'EOF'
import json, os, re, sys
import yaml

docker = sys.argv[1]
errors = []
prov = os.path.join(docker, "grafana", "provisioning")
ds = yaml.safe_load(open(os.path.join(prov, "datasources", "prometheus.yml")))
sources = {d["uid"]: d for d in ds.get("datasources", [])}
if ds.get("apiVersion") != 1 or not sources:
    errors.append("datasources: apiVersion 1 and at least one datasource expected")
for uid, d in sources.items():
    for key in ("name", "type", "url", "access"):
        if key not in d:
            errors.append(f"datasource {uid}: no {key}")
dash = yaml.safe_load(open(os.path.join(prov, "dashboards", "ketch.yml")))
providers = dash.get("providers", [])
if dash.get("apiVersion") != 1 or not providers:
    errors.append("dashboards: apiVersion 1 and a provider expected")
compose = yaml.safe_load(open(os.path.join(docker, "..", "docker-compose.yml")))
mounts = compose["services"]["grafana"]["volumes"]
for p in providers:
    path = p.get("options", {}).get("path")
    if not any(m.split(":")[1] == path for m in mounts):
        errors.append(f"dashboard provider path {path} is not mounted in the grafana service")
board = json.load(open(os.path.join(docker, "grafana", "dashboards", "ketch.json")))
ids, cells, names = set(), {}, set()
for panel in board["panels"]:
    if panel["id"] in ids:
        errors.append(f"panel id {panel['id']} repeated")
    ids.add(panel["id"])
    g = panel["gridPos"]
    if g["x"] + g["w"] > 24:
        errors.append(f"panel {panel['title']!r} is wider than the grid")
    for x in range(g["x"], g["x"] + g["w"]):
        for y in range(g["y"], g["y"] + g["h"]):
            if (x, y) in cells:
                errors.append(f"panels {cells[(x, y)]!r} and {panel['title']!r} overlap")
            cells[(x, y)] = panel["title"]
    for t in panel.get("targets", []):
        uid = t.get("datasource", {}).get("uid")
        if uid not in sources:
            errors.append(f"panel {panel['title']!r}: datasource uid {uid} is not provisioned")
        names.update(re.findall(r"\b(ketch_[a-z_]+)\b", t["expr"]))
errors = sorted(set(errors))
with open(os.environ.get("METRICS_OUT", "/dev/null"), "w") as f:
    f.write("\n".join(sorted(names)) + "\n")
for e in errors:
    print("grafana:", e, file=sys.stderr)
print(f"grafana: {len(sources)} datasource(s), {len(board['panels'])} panels, {len(names)} ketch metrics used")
sys.exit(1 if errors else 0)
EOF
}

# The default target (a release build from source) with a stand-in for the
# Rust image, whose `cargo` checks that it runs in the whole source tree and
# "builds" a script: this checks the stage order (the classic builder builds
# `prebuilt` too, from a context without a binary), .dockerignore and the
# COPY paths, not the compilation (a cold release build takes ~26 min here).
check_default_target() {
    mkdir -p "$work/fake-rust"
    cat >"$work/fake-rust/cargo" <<'CARGO'
#!/bin/sh
set -e
echo "stand-in cargo $*"
[ "$*" = "build --release --locked -p ketch-gateway --bin ketch" ]
for f in Cargo.toml Cargo.lock config/Cargo.toml storage/Cargo.toml tiering/Cargo.toml gateway/Cargo.toml \
    tests/Cargo.toml benchmark/Cargo.toml vendor/kafka-protocol/Cargo.toml gateway/src/main.rs; do
    [ -f "$f" ] || { echo "the build context has no $f"; exit 1; }
done
if [ -e target ] || [ -e .git ]; then
    echo "the build context has target/ or .git"
    exit 1
fi
mkdir -p target/release
printf '#!/bin/sh\necho "ketch (stand-in build)"\n' >target/release/ketch
CARGO
    printf '#!/bin/sh\nexit 0\n' >"$work/fake-rust/strip"
    chmod +x "$work/fake-rust/cargo" "$work/fake-rust/strip"
    printf 'FROM %s\nCOPY cargo strip /usr/local/bin/\n' "$base_image" >"$work/fake-rust/Dockerfile"
    docker_build ketch-test/fake-rust "$work/fake-rust"
    docker build --network host --label ketch-test.image=1 -t ketch-test/ketch-default \
        --build-arg BUILDER_IMAGE=ketch-test/fake-rust --build-arg "RUNTIME_IMAGE=$base_image" . \
        >"$work/build-default.log" 2>&1 || { tail -n 40 "$work/build-default.log" >&2; return 1; }
    note "$(grep -m1 'Sending build context' "$work/build-default.log")"
    [ "$(docker run --rm ketch-test/ketch-default)" = "ketch (stand-in build)" ] || return 1
    docker rmi ketch-test/ketch-default >/dev/null
}

port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

start_stack() {
    # What a previous run killed before its cleanup left (dockerd restarts
    # its containers).
    compose --profile cluster --profile tools down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true
    local port
    for port in "$kafka_port" 9090 9001; do
        port_free "$port" || { note "port $port on this machine is taken (the stack publishes it)"; return 1; }
    done
    stack_up=1
    if [ "$redis_mode" = cluster ]; then
        compose up -d --no-build redis-cluster-init >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; return 1; }
        local deadline=$((SECONDS + 90)) state
        while :; do
            state=$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$(compose ps -q redis-cluster-init)")
            case "$state" in
                "exited 0") break ;;
                exited*) note "redis-cluster-init failed"; compose logs --no-color redis-cluster-init >&2; return 1 ;;
            esac
            [ "$SECONDS" -lt "$deadline" ] || { note "redis-cluster-init still $state after 90 s"; return 1; }
            sleep 1
        done
        note "$(compose logs --no-color redis-cluster-init | grep 'cluster joined' | sed 's/.*| //')"
    fi
    # Everything but Grafana (no stand-in) and the query tool (run on demand).
    compose up -d --no-build redis postgres minio minio-init gateway-1 gateway-2 gateway-3 haproxy prometheus \
        >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; return 1; }
}

gateway_health() {
    local c
    for c in $(compose ps -q gateway-1 gateway-2 gateway-3); do
        docker inspect -f '{{.Name}}={{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$c"
    done
}

wait_ready() {
    local deadline=$((SECONDS + 180)) health
    while :; do
        health=$(gateway_health | tr '\n' ' ')
        if [ "$(grep -o '=healthy' <<<"$health" | wc -l)" -eq 3 ] \
            && python3 - "$bootstrap" >/dev/null 2>&1 <<'EOF'; then
import sys
from confluent_kafka.admin import AdminClient
AdminClient({"bootstrap.servers": sys.argv[1]}).list_topics(timeout=5)
EOF
            note "gateways: $health; the load balancer answers Metadata"
            return 0
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            note "after 180 s: gateways $health"
            return 1
        fi
        sleep 2
    done
}

# The client side of the checks: create the topic, consume with a group,
# Metadata. Produce is kcat's (produce_records).
cat >"$work/client.py" <<'EOF'
import json
import sys
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap, action, topic = sys.argv[1], sys.argv[2], sys.argv[3]


def create():
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = {
        "remote.storage.enable": "true",
        # Small segments that seal within seconds, so the archive fills
        # while the test waits (docs/tiered-storage.md).
        "segment.bytes": "16384",
        "segment.ms": "1000",
    }
    admin.create_topics([NewTopic(topic, num_partitions=6, replication_factor=1, config=configs)])[topic].result(30)
    md = admin.list_topics(topic, timeout=10)
    parts = len(md.topics[topic].partitions)
    assert parts == 6, f"{topic} has {parts} partitions, expected 6"
    print(f"created {topic}: 6 partitions, remote.storage.enable=true")


def consume(expected_count, expected_file):
    expected = {}
    with open(expected_file) as f:
        for line in f:
            key, value = line.rstrip("\n").split(":", 1)
            expected[key] = value
    assert len(expected) == expected_count
    group = f"{topic}-group"
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 10000,
    })
    consumer.subscribe([topic])
    seen, per_partition, errors = {}, {}, []
    deadline = time.monotonic() + 90
    while len(seen) < expected_count and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            errors.append(str(msg.error()))
            continue
        key, value = msg.key().decode(), msg.value().decode()
        if key in seen:
            errors.append(f"{key} delivered twice")
        seen[key] = value
        per_partition[msg.partition()] = per_partition.get(msg.partition(), 0) + 1
    if seen:
        consumer.commit(asynchronous=False)
    consumer.close()
    assert not [e for e in errors if "twice" in e], errors[:5]
    assert len(seen) == expected_count, f"consumed {len(seen)} of {expected_count} records (errors: {errors[:5]})"
    wrong = [k for k, v in seen.items() if expected.get(k) != v]
    assert not wrong, f"{len(wrong)} records differ, e.g. {wrong[:3]}"

    # The group's committed offsets, read back by another consumer of the group.
    check = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    committed = check.committed([TopicPartition(topic, p) for p in range(6)], timeout=30)
    check.close()
    got = {tp.partition: tp.offset for tp in committed}
    assert got == {p: per_partition.get(p, 0) for p in range(6)}, \
        f"committed offsets {got}, consumed per partition {per_partition}"
    print(json.dumps({"consumed": len(seen), "per_partition": per_partition, "committed": got}))


def metadata(port):
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    brokers = sorted((b.id, b.host, b.port) for b in md.brokers.values())
    print(f"Metadata brokers: {brokers}")
    assert len(brokers) == 1, f"{len(brokers)} brokers in Metadata, expected exactly one (the load balancer)"
    _, host, got_port = brokers[0]
    assert (host, got_port) == ("localhost", int(port)), f"the broker is {host}:{got_port}, expected localhost:{port}"


try:
    if action == "create":
        create()
    elif action == "consume":
        consume(int(sys.argv[4]), sys.argv[5])
    elif action == "metadata":
        metadata(sys.argv[4])
except (AssertionError, KafkaException) as e:
    print(f"{action}: {e}", file=sys.stderr)
    sys.exit(1)
EOF

topic="compose-test-$(date +%s)"
records=1000

create_topic() {
    python3 "$work/client.py" "$bootstrap" create "$topic"
}

produce_records() {
    seq 1 "$records" | sed 's/.*/key-&:value-&/' >"$work/records.txt"
    kcat -b "$bootstrap" -P -t "$topic" -K: -X acks=all <"$work/records.txt" || return 1
    # Every record is stored: the partitions' high watermarks add up.
    local total
    total=$(python3 - "$bootstrap" "$topic" <<'EOF'
import sys
from confluent_kafka import Consumer, TopicPartition
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": "compose-test-watermarks"})
print(sum(c.get_watermark_offsets(TopicPartition(sys.argv[2], p), timeout=10)[1] for p in range(6)))
c.close()
EOF
    )
    note "high watermarks add up to $total"
    [ "$total" -eq "$records" ]
}

consume_with_group() {
    python3 "$work/client.py" "$bootstrap" consume "$topic" "$records" "$work/records.txt"
}

one_broker_in_metadata() {
    python3 "$work/client.py" "$bootstrap" metadata "$topic" "$kafka_port"
}

archive_queryable() {
    local out="$work/query.json"
    compose run --rm -T query "$topic" --wait-rows "$records" --timeout 180 --limit 3 --json \
        >"$out" 2>"$work/query.err" || { cat "$out" "$work/query.err" >&2; return 1; }
    python3 - "$out" "$records" <<'EOF'
import json, sys
got = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
want = int(sys.argv[2])
errors = []
if got["rows"] != want:
    errors.append(f"{got['rows']} rows archived, expected {want}")
for p, v in got["partitions"].items():
    if v["rows"] != v["distinct"] or v["first"] != 0 or v["last"] != v["rows"] - 1:
        errors.append(f"partition {p}: {v}")
for row in got["sample"]:
    if row["value"] != row["key"].replace("key-", "value-"):
        errors.append(f"row {row} does not hold what was produced")
print(f"archive: {got['table']}: {got['rows']} rows in {len(got['partitions'])} partitions; first rows {got['sample']}")
for e in errors:
    print("archive:", e, file=sys.stderr)
sys.exit(1 if errors else 0)
EOF
}

# With COMPOSE_TEST_REDIS=cluster: each master holds some of the topic's
# partitions (ketch spreads them evenly at creation). The stack is new, so
# every partition log (ketch:{TAG}:log) is the topic's.
partitions_spread_over_the_cluster() {
    local node logs total=0 counts=""
    for node in redis-c1 redis-c2 redis-c3; do
        logs=$(compose exec -T "$node" redis-cli --scan --pattern 'ketch:{*}:log' | wc -l)
        counts="$counts $node=$logs"
        total=$((total + logs))
        [ "$logs" -gt 0 ] || { note "partition logs per master:$counts"; return 1; }
    done
    note "partition logs per master:$counts"
    [ "$total" -eq 6 ]
}

prometheus_scrapes() {
    local deadline=$((SECONDS + 60))
    until [ "$(curl -fsS 'http://127.0.0.1:9090/api/v1/query' --data-urlencode 'query=sum(up{job="ketch"})' \
        | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else 0)')" = 3 ]; do
        [ "$SECONDS" -lt "$deadline" ] || { note "Prometheus does not see 3 gateways up"; return 1; }
        sleep 2
    done
    # Every ketch metric the dashboard uses is exported (some, like the
    # group lag the coordinator computes every 10 s, a few scrapes after
    # the traffic that makes them).
    local missing
    while :; do
        curl -fsS 'http://127.0.0.1:9090/api/v1/label/__name__/values' \
            | python3 -c 'import json,sys; print("\n".join(n for n in json.load(sys.stdin)["data"] if n.startswith("ketch_")))' \
            | sort >"$work/exported.txt"
        missing=$(comm -23 "$work/dashboard-metrics.txt" "$work/exported.txt")
        [ -n "$missing" ] || break
        [ "$SECONDS" -lt "$deadline" ] || { note "the dashboard uses metrics no gateway exports: $missing"; return 1; }
        sleep 2
    done
    note "Prometheus scrapes 3 gateways; $(wc -l <"$work/exported.txt") ketch metrics, every one the dashboard uses"
}

# --- run ----------------------------------------------------------------------

log "prerequisites"
install_prerequisites
start_docker
check "compose files are valid (docker-compose $(docker-compose version --short 2>/dev/null))" check_compose_config
check "Grafana provisioning and dashboard" check_grafana_files
sort -o "$work/dashboard-metrics.txt" "$work/dashboard-metrics.txt"
build_images
log "images ready"
check "the ketch image (prebuilt target): runs, non-root, ports 9092 and 9644, healthcheck" check_ketch_image
check "the Dockerfile's default target builds (with a stand-in Rust toolchain)" check_default_target
check "the stack starts (docker-compose up)" start_stack
check "three healthy gateways behind the load balancer at $bootstrap" wait_ready
check "create $topic (6 partitions, archived) through the load balancer" create_topic
check "produce $records records with kcat" produce_records
check "consume them with a consumer group and commit" consume_with_group
check "the archive holds every record (docker-compose run query)" archive_queryable
if [ "$redis_mode" = cluster ]; then
    check "the topic's partitions are spread over the 3 Redis masters" partitions_spread_over_the_cluster
fi
check "Prometheus scrapes every gateway" prometheus_scrapes
check "Metadata lists exactly one broker, $bootstrap" one_broker_in_metadata
