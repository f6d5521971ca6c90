# syntax=docker/dockerfile:1
# Build the self-contained conveyor binary, then ship it with the plugins in a
# slim image as a non-root user. The image has no PostgreSQL: set DATABASE_URL
# (compose.yaml runs postgres:18 next to it).
ARG BUN_VERSION=1.4.5

FROM oven/bun:${BUN_VERSION} AS build
WORKDIR /src
COPY package.json package-lock.json ./
COPY scripts ./scripts
# --ignore-scripts: the embedded PostgreSQL binaries are not needed to build.
# That also skips our own postinstall, the postgres.js patches the engine
# relies on (scripts/patch-postgres.mjs: statements that never settle, a
# closed transaction's statements running outside it), so apply them here.
RUN bun install --production --ignore-scripts && bun scripts/patch-postgres.mjs
COPY tsconfig.json main.ts ./
COPY src ./src
COPY migrations ./migrations
RUN bun build --compile main.ts --outfile dist/conveyor

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --home-dir /app --no-create-home conveyor
WORKDIR /app
COPY --from=build /src/dist/conveyor /usr/local/bin/conveyor
COPY plugins ./plugins
COPY deploy/conveyor.toml ./conveyor.toml
USER conveyor
EXPOSE 8080
# SIGTERM drains running jobs for [worker] grace_ms, then exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["conveyor"]
CMD ["start", "--config", "/app/conveyor.toml"]
