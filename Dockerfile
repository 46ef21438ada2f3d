# syntax=docker/dockerfile:1
# kruise-rs: static binaries for `kruise-rs manager` (and `crds`, and `daemon`) and for
# `kruise-rs-daemon`, the daemon alone, which the chart's DaemonSet runs (a smaller idle RSS).
#
#   docker build -t ghcr.io/kruise-rs/kruise-rs:0.1.0 .
#
# Build stage: release builds against musl, fully static (TLS is rustls + ring, no OpenSSL); the
# daemon with the size-optimized `release-daemon` profile (Cargo.toml).
# protobuf-compiler is needed by the k8s-cri crate, which generates the CRI bindings with protoc.
FROM docker.io/library/rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler musl-tools \
 && rm -rf /var/lib/apt/lists/*
# `uname -m` is the target architecture (buildx runs this stage per platform).
RUN rustup target add "$(uname -m)-unknown-linux-musl"
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(uname -m)-unknown-linux-musl" \
 && cargo build --release --locked --bin kruise-rs --target "$target" \
 && cargo build --profile release-daemon --locked --bin kruise-rs-daemon --target "$target" \
 && install -D -m 0755 "target/$target/release/kruise-rs" /out/kruise-rs \
 && install -D -m 0755 "target/$target/release-daemon/kruise-rs-daemon" /out/kruise-rs-daemon

# Final stage: distroless static (CA certificates, /etc/passwd with `nonroot`, no shell).
# Runs as uid 65532 by default (the manager); the daemon's DaemonSet sets runAsUser: 0 because
# the CRI socket on the host is owned by root.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kruise-rs /out/kruise-rs-daemon /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kruise-rs"]
CMD ["manager"]
