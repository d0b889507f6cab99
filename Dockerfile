# syntax=docker/dockerfile:1
#
# flowrun's container image: a static binary (no cgo) on distroless's static image, run as the
# unprivileged user nonroot. Build it from the checkout, naming the version and commit that
# `flowrun version` prints (the .git directory stays out of the build context):
#
#   docker build -t flowrun:0.1.0 \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg COMMIT=$(git rev-parse HEAD) .
#
# and run a pipeline mounted into it (docs/deploy.md):
#
#   docker run --rm -v $PWD/examples/pipelines/orders:/pipeline:ro \
#     -e FLOWRUN_REDIS_URL=redis://redis:6379 -p 9464:9464 \
#     flowrun:0.1.0 run /pipeline --http 0.0.0.0:9464

ARG GO_VERSION=1.25

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# The modules first, in a layer of their own that changes only with go.mod and go.sum.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=""
ARG COMMIT=""
# CGO_ENABLED=0: a static binary, which the runtime image (no C library) needs. -buildvcs=false:
# there is no .git here; the version and commit come from the build arguments.
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/flowrun/flowrun/cmd.Version=${VERSION} -X github.com/flowrun/flowrun/cmd.Commit=${COMMIT}" \
      -o /out/flowrun ./cmd/flowrun

# distroless/static has CA certificates (for rediss:// and https), time zone data and a nonroot user
# (65532), and no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/flowrun /usr/local/bin/flowrun
COPY LICENSE NOTICE /usr/share/doc/flowrun/
USER nonroot:nonroot
# The port of --http (/healthz, /readyz, /metrics and the live page) in docs/deploy.md's examples.
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/flowrun"]
CMD ["--help"]
