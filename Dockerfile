# switchboard server image: build with the Rust toolchain, run on slim Debian
# as a non-root user. `docker build -t switchboard . && docker run -p 8000:8000 switchboard`
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY config ./config
COPY src ./src
# No debug info in the image (the release profile keeps some for profiling).
ENV CARGO_PROFILE_RELEASE_DEBUG=0
RUN cargo build --release --locked --bin switchboard

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin switchboard
COPY --from=build /src/target/release/switchboard /usr/local/bin/switchboard
USER switchboard
# Listen on every interface inside the container; all other settings keep
# their defaults and can be overridden with SWITCHBOARD__SECTION__KEY.
ENV SWITCHBOARD__SERVER__HOST=0.0.0.0
EXPOSE 8000
# The server is PID 1 and handles SIGTERM itself (graceful shutdown, exit 0).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/switchboard"]
