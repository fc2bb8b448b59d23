# Multi-stage build of the `mira` binary; the runtime image runs as a non-root user.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY src ./src
COPY benches ./benches
COPY migrations ./migrations
COPY web ./web
RUN cargo build --release --locked --bin mira

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates bash git python3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 mira \
 && mkdir -p /data /workspace && chown mira:mira /data /workspace
COPY --from=build /src/target/release/mira /usr/local/bin/mira
USER mira
ENV MIRA_LISTEN=0.0.0.0:8080 MIRA_DATA_DIR=/data MIRA_WORKSPACE=/workspace
VOLUME ["/data", "/workspace"]
EXPOSE 8080
ENTRYPOINT ["mira"]
CMD ["serve"]
