# The exporter image the Helm chart runs (ghcr.io/zonewatch/zonewatch-exporter).
# Static, no cgo: GPU data comes from dcgm-exporter pages. A DCGM/NVML build
# needs cgo, the NVIDIA libraries at run time and `-tags nvml`.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/prometheus/common/version.Version=${VERSION}" \
      -o /zonewatch-exporter ./cmd/exporter

FROM gcr.io/distroless/static-debian12
COPY --from=build /zonewatch-exporter /zonewatch-exporter
EXPOSE 19420
ENTRYPOINT ["/zonewatch-exporter"]
