# aipgw container image: multi-stage, release build, small non-root runtime.
# Config and certificates are mounted; see README.md ("Docker").
# No Docker engine runs on the development machines: `.ci/image-build-check` (run by
# .ci/run) builds the build stage's exact `cargo build` in a directory holding only what
# the stage copies, with .dockerignore applied.

FROM rust:1-bookworm AS build
WORKDIR /src
# The whole context minus .dockerignore: cargo reads every target the manifest declares
# (benches, tests, examples), even to build the one binary.
COPY . ./
# The production build leaves out the demo and the development certificate generator.
RUN cargo build --release --locked --no-default-features --features jemalloc --bin aipgw

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home aipgw
COPY --from=build /src/target/release/aipgw /usr/local/bin/aipgw
USER 10001
# 8443: the TLS listener; 9901: the admin listener (/healthz, /readyz, /metrics).
# The mounted config must bind them on 0.0.0.0 (listener.bind, admin.bind).
EXPOSE 8443 9901
VOLUME ["/etc/aipgw"]
ENTRYPOINT ["/usr/local/bin/aipgw"]
CMD ["run", "--config", "/etc/aipgw/aipgw.toml"]
