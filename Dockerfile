# syntax=docker/dockerfile:1
#
# The `primus` image: one image holding
#   /usr/local/bin/primus           the CLI and the benchmark runner of benchmark pods
#   /usr/local/bin/primus-operator  the TrainingPlan operator
#   /usr/local/bin/primus-webhook   the admission webhook
# The hardware profiles and model cards of profiles/ are compiled into the binaries
# (oracle/build.rs); more can be mounted and passed with --profiles-dir.
#
#   docker build -t ghcr.io/primus-projection/primus:0.1.0 .
#
# The runtime stage is distroless (glibc, CA certificates, no shell), runs as the non-root
# user 65532 and needs no writable root file system. Build notes: docs/image.md.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM docker.io/library/rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
# Extra cargo features, e.g. "primus-cli/cuda" for a CUDA benchmark image (cudarc loads the
# CUDA libraries at run time, so it builds without them).
ARG PRIMUS_FEATURES=""
ENV CARGO_TERM_COLOR=never \
    CARGO_INCREMENTAL=0 \
    CARGO_NET_RETRY=5
# ring (the one TLS crypto provider) needs a C compiler; nothing links OpenSSL.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The lock file is authoritative (--locked); caches keep rebuilds incremental.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked \
        -p primus-cli -p primus-operator -p primus-webhook \
        --bin primus --bin primus-operator --bin primus-webhook \
        ${PRIMUS_FEATURES:+--features "$PRIMUS_FEATURES"} \
 && mkdir -p /out \
 && install -m 0755 target/release/primus target/release/primus-operator target/release/primus-webhook /out/ \
 && /out/primus --version && /out/primus-operator --version && /out/primus-webhook --version

FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="primus" \
      org.opencontainers.image.description="Primus Projection: projection oracle CLI, TrainingPlan operator and admission webhook" \
      org.opencontainers.image.source="https://github.com/primus-projection/primus-projection" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
# The chart sets the command of each container (primus-operator, primus-webhook); benchmark
# pods run `primus bench ...`.
CMD ["primus", "--help"]
