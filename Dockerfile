# switchboard server image: build with the Rust toolchain, run on slim Debian
# as a non-root user. `docker build -t switchboard . && docker run -p 8000:8000 -p 127.0.0.1:9000:9000 \
# -e SWITCHBOARD__AUTH__PUBLISH_TOKEN=... switchboard`
FROM rust:1-slim-bookworm AS build
WORKDIR /src
# Only the server package is built. Cargo still reads the whole workspace,
# so the tools' and harness's manifests come along, with an empty target
# each: their sources never enter the image. The ports crate (the port-list
# parser) is a dependency of the server and comes whole.
COPY Cargo.toml Cargo.lock ./
COPY tools/Cargo.toml ./tools/
COPY bench/Cargo.toml ./bench/
RUN mkdir -p tools/src bench/src && touch tools/src/lib.rs && echo 'fn main() {}' > bench/src/main.rs
COPY ports ./ports
COPY config ./config
COPY src ./src
# No debug info in the image (the release profile keeps some for profiling).
ENV CARGO_PROFILE_RELEASE_DEBUG=0
RUN cargo build --release --locked -p switchboard --bin switchboard

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin switchboard
COPY --from=build /src/target/release/switchboard /usr/local/bin/switchboard
USER switchboard
# Listen on every interface inside the container; all other settings keep
# their defaults and can be overridden with SWITCHBOARD__SECTION__KEY.
# Without SWITCHBOARD__AUTH__PUBLISH_TOKEN, publishing from outside the
# container is refused (protected mode, docs/exposing.md): set a token.
ENV SWITCHBOARD__SERVER__HOST=0.0.0.0
# The internal listener for operators (/metrics, /stats, /cluster, the
# dashboard): on loopback inside the container nothing outside could reach
# it, so it listens on every interface of the container too, on its own
# port. Publish it only to where Prometheus and operators are, e.g.
# `-p 127.0.0.1:9000:9000`, never to the internet (docs/exposing.md).
ENV SWITCHBOARD__SERVER__ADMIN_HOST=0.0.0.0
EXPOSE 8000
EXPOSE 9000
# The server is PID 1 and handles SIGTERM itself (graceful shutdown, exit 0).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/switchboard"]
