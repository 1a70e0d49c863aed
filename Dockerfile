# aipgw container image: multi-stage, release build, small non-root runtime.
# Config and certificates are mounted; see README.md ("Docker").
# (No Docker engine runs on the development machines, so this file is not built in CI.)

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin aipgw

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home aipgw
COPY --from=build /src/target/release/aipgw /usr/local/bin/aipgw
USER 10001
# 8443: the TLS listener (listener.bind must be 0.0.0.0:8443 in the mounted config).
EXPOSE 8443
VOLUME ["/etc/aipgw"]
ENTRYPOINT ["/usr/local/bin/aipgw"]
CMD ["run", "--config", "/etc/aipgw/aipgw.toml"]
