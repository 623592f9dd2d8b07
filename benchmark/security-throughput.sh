#!/usr/bin/env bash
# Produce throughput through SASL_SSL against PLAINTEXT, measured in one run
# on one gateway that has both listeners:
#
#   benchmark/security-throughput.sh [KETCH_BIN] [ROUNDS]
#
# One redis-server and one ketch (default: the release build) with two named
# listeners, PLAINTEXT and SASL_SSL (SCRAM-SHA-512, TLS with a certificate
# made here), and ACLs on: the producer's principal (User:bench on SASL_SSL,
# User:ANONYMOUS on PLAINTEXT) may write topics prefixed `bench-`, so both
# paths pay for authorisation. Each round produces RECORDS records of 1 KiB
# with kcat (librdkafka, acks=all, linger 5 ms) to a fresh 16-partition topic
# through each listener in turn, alternating which goes first, and prints
# records/s and the CPU µs per record of the gateway, Redis and kcat. Knobs
# (environment): RECORDS (default 300000).
set -euo pipefail

target="${CARGO_TARGET_DIR:-target}"
ketch=${1:-$target/release/ketch}
rounds=${2:-3}
records=${RECORDS:-300000}
[ -x "$ketch" ] || { echo "no ketch binary at $ketch (cargo build --release -p ketch-gateway)" >&2; exit 1; }
command -v kcat >/dev/null || { echo "kcat is needed (apt-get install kcat)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time is needed (apt-get install time)" >&2; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

work=$(mktemp -d)
cleanup() {
    [ -n "${ketch_pid:-}" ] && kill "$ketch_pid" 2>/dev/null && wait "$ketch_pid" 2>/dev/null
    [ -n "${redis_pid:-}" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# Certificates: a CA and a server certificate for 127.0.0.1.
(
    cd "$work"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem \
        -days 1 -subj "/CN=bench CA" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr \
        -subj "/CN=localhost" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 1 \
        -extfile ext 2>/dev/null
)

# 1 KiB records (1023 bytes and a newline), varied so compression or
# caching cannot help either side.
python3 - "$work/records" "$records" <<'EOF'
import random, string, sys
rng = random.Random(7)
alphabet = (string.ascii_letters + string.digits).encode()
with open(sys.argv[1], "wb") as f:
    block = bytes(rng.choice(alphabet) for _ in range(1 << 16))
    for i in range(int(sys.argv[2])):
        start = rng.randrange(0, len(block) - 1023)
        f.write(block[start:start + 1023] + b"\n")
EOF

redis_port=$(free_port)
: >"$work/redis.log"
: >"$work/ketch.log"
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" 2>&1 &
redis_pid=$!
until grep -q "Ready to accept connections" "$work/redis.log"; do kill -0 "$redis_pid"; sleep 0.05; done
redis_url="redis://127.0.0.1:$redis_port"

env -u KETCH_BIN "$ketch" users set bench --mechanism SCRAM-SHA-512 --redis-url "$redis_url" <<<"bench-secret" >/dev/null
env -u KETCH_BIN "$ketch" users set admin --mechanism SCRAM-SHA-512 --redis-url "$redis_url" <<<"admin-secret" >/dev/null

plain_port=$(free_port)
sasl_port=$(free_port)
listeners="PLAINTEXT://127.0.0.1:$plain_port,SASL_SSL://127.0.0.1:$sasl_port"
env -u KETCH_BIN "$ketch" serve --redis-url "$redis_url" --http-listen "127.0.0.1:$(free_port)" --node-id 0 \
    --set "broker.listeners=$listeners" --set "broker.advertised_listeners=$listeners" \
    --set "tls.cert_file=$work/server.pem" --set "tls.key_file=$work/server.key" \
    --set sasl.mechanisms=SCRAM-SHA-512 --set acl.enabled=true --set acl.super_users=admin \
    >"$work/ketch.log" 2>&1 &
ketch_pid=$!
until grep -q "ketch serving" "$work/ketch.log"; do
    kill -0 "$ketch_pid" || { cat "$work/ketch.log" >&2; exit 1; }
    sleep 0.05
done

plain=(-b "127.0.0.1:$plain_port")
sasl=(-b "127.0.0.1:$sasl_port" -X security.protocol=SASL_SSL -X sasl.mechanisms=SCRAM-SHA-512
    -X sasl.username=bench -X sasl.password=bench-secret -X "ssl.ca.location=$work/ca.pem")

# Runs Python (on stdin) with `connect()`, an AdminClient of the admin user;
# sys.argv[3] is the first argument.
admin_python() {
    python3 -c "
import sys
from confluent_kafka.admin import *
def connect():
    return AdminClient({'bootstrap.servers': sys.argv[1], 'security.protocol': 'SASL_SSL',
                        'sasl.mechanism': 'SCRAM-SHA-512', 'sasl.username': 'admin',
                        'sasl.password': 'admin-secret', 'ssl.ca.location': sys.argv[2]})
exec(sys.stdin.read())
" "127.0.0.1:$sasl_port" "$work/ca.pem" "$@"
}

# ACLs: WRITE (and CREATE, for the topics) on `bench-*` for both principals.
admin_python <<'EOF'
admin = connect()
acls = [AclBinding(ResourceType.TOPIC, "bench-", ResourcePatternType.PREFIXED, p, "*", op,
                   AclPermissionType.ALLOW)
        for p in ("User:bench", "User:ANONYMOUS")
        for op in (AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE)]
for f in admin.create_acls(acls).values():
    f.result()
EOF

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

produce() { # name, kcat connection args...
    local name=$1; shift
    local topic="bench-$name-$RANDOM$RANDOM"
    admin_python "$topic" <<'EOF'
admin = connect()
admin.create_topics([NewTopic(sys.argv[3], 16, 1)])[sys.argv[3]].result()
EOF
    local cpu0 t0 t1 cpu1
    cpu0=$(cpu_ticks "$ketch_pid")
    rcpu0=$(cpu_ticks "$redis_pid")
    t0=$(date +%s.%N)
    /usr/bin/time -f "%U %S" -o "$work/kcat.time" \
        kcat -P "$@" -t "$topic" -X acks=all -X linger.ms=5 -X batch.num.messages=10000 \
        -X queue.buffering.max.messages=1000000 <"$work/records"
    t1=$(date +%s.%N)
    cpu1=$(cpu_ticks "$ketch_pid")
    rcpu1=$(cpu_ticks "$redis_pid")
    read -r user sys <"$work/kcat.time"
    python3 -c "
n, t, client = $records, $t1 - $t0, $user + $sys
cpu, redis = ($cpu1 - $cpu0) / $hz, ($rcpu1 - $rcpu0) / $hz
print(f'{\"$name\":<10} {n / t:>10,.0f} rec/s  {n * 1024 / t / 2**20:>6.1f} MiB/s  '
      f'CPU µs/record: ketch {cpu * 1e6 / n:5.2f}, Redis {redis * 1e6 / n:5.2f}, kcat {client * 1e6 / n:5.2f}')"
    # Each round starts from an empty Redis: delete the topic and wait for
    # Redis to have freed it (a Redis holding gigabytes more costs more per
    # record, which would favour whichever listener went first).
    admin_python "$topic" <<'EOF'
admin = connect()
admin.delete_topics([sys.argv[3]])[sys.argv[3]].result()
EOF
    until redis-cli -p "$redis_port" info memory | grep -q "^lazyfree_pending_objects:0"; do sleep 0.1; done
}

echo "ketch $("$ketch" --version 2>/dev/null || true), $records × 1 KiB, 16 partitions, acks=all, kcat $(kcat -V 2>&1 | head -1 | awk '{print $2}')"
for round in $(seq 1 "$rounds"); do
    if (( round % 2 )); then
        produce PLAINTEXT "${plain[@]}"
        produce SASL_SSL "${sasl[@]}"
    else
        produce SASL_SSL "${sasl[@]}"
        produce PLAINTEXT "${plain[@]}"
    fi
done
