# The ketch image: the `ketch` binary on a small Debian, as a non-root user.
#
#   docker build -t ketch .                      # release build from source (default target)
#   docker build --target prebuilt -t ketch DIR  # from a binary already built: DIR holds this
#                                                # Dockerfile, docker/ketch-healthcheck and `ketch`
#
# Build arguments: BUILDER_IMAGE (a Rust toolchain, at least the workspace's
# rust-version) and RUNTIME_IMAGE (a Debian whose glibc is at least the
# builder's; for `prebuilt`, at least that of the machine that built the
# binary). docs/deployment.md has the details.
#
# Stage order matters for the classic builder (docker-compose 1.x, or docker
# without BuildKit), which builds every stage before the target: `prebuilt`
# comes before `builder`, so `--target prebuilt` never compiles, and its COPY
# tolerates a context without a binary, so the default build does not fail
# on it.

ARG BUILDER_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# --- runtime: what every ketch image has --------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime
# CA certificates for rediss:// and https S3 endpoints and REST catalogs
# (ketch trusts the system's roots). Skipped when the base already has them.
RUN if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/ketch --create-home \
        --shell /usr/sbin/nologin ketch
# Containers listen on every interface; the data directory (embedded SQLite
# catalog and local warehouse, used only when no catalog_uri / warehouse is
# set) is the ketch user's home.
ENV KETCH_BROKER_LISTEN=0.0.0.0:9092 \
    KETCH_HTTP_LISTEN=0.0.0.0:9644 \
    KETCH_TIERING_DATA_DIR=/var/lib/ketch
WORKDIR /var/lib/ketch
USER ketch
# 9092: Kafka; 9644: HTTP /health, /ready, /metrics.
EXPOSE 9092 9644
HEALTHCHECK --interval=5s --timeout=3s --start-period=20s --retries=3 CMD ["ketch-healthcheck"]
ENTRYPOINT ["ketch"]
CMD ["serve"]

# --- prebuilt: the binary from the build context ------------------------------
# `ketc[h]` is a pattern so that this COPY succeeds (copying only the
# healthcheck) when the context has no binary, as in a plain `docker build .`
# with the classic builder, which builds this stage too and then drops it.
FROM runtime AS prebuilt
COPY docker/ketch-healthcheck ketc[h] /usr/local/bin/

# --- builder: a release build from source -------------------------------------
FROM ${BUILDER_IMAGE} AS builder
WORKDIR /src
COPY . .
# Debug info (line tables, kept in the workspace's release profile for
# backtraces in tests) is stripped; the symbols stay, so backtraces still
# name functions.
RUN cargo build --release --locked -p ketch-gateway --bin ketch \
    && install -D -m 0755 target/release/ketch /out/ketch \
    && strip --strip-debug /out/ketch \
    && rm -rf target

# --- release (default): the runtime with the binary built above --------------
FROM runtime AS release
COPY docker/ketch-healthcheck /usr/local/bin/
COPY --from=builder /out/ketch /usr/local/bin/ketch
