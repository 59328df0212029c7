# hedgekv in an empty image: one statically linked binary, nothing else.
#
# No base image is pulled (FROM scratch), so the image builds with no
# registry in reach. The binary is built first, outside Docker, and the
# build context holds only it and an empty data directory:
#
#   make image                 # both steps; IMAGE=hedgekv:latest by default
#
# which is
#
#   CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/hedgekv-static ./cmd/hedgekv
#   mkdir -p bin/image/data && cp bin/hedgekv-static bin/image/hedgekv
#   docker build -f Dockerfile -t hedgekv:latest bin/image
#
# CGO_ENABLED=0 matters: a binary linked against libc finds no loader in
# scratch and fails to start with a bare "no such file or directory".
#
# Run a store (see deploy/compose.yaml for a three-store cluster):
#
#   docker run IMAGE server --id 1 --listen 0.0.0.0:20160 --status 0.0.0.0:20180 \
#       --peers 1=hedgekv-1:20160,2=hedgekv-2:20160,3=hedgekv-3:20160 \
#       --zone dc-a --data-dir /data
#
# and the CLI inside it (there is no shell): docker exec CONTAINER /hedgekv get KEY
FROM scratch

# The empty directory is copied, rather than left to `VOLUME`, so that it is
# owned by the store's user: Docker seeds a new named volume with the
# ownership of the image's directory, and one it creates itself is root's,
# which an unprivileged store could not write to.
COPY --chown=65532:65532 data /data
COPY hedgekv /hedgekv

# No /etc/passwd in scratch, so a numeric id: an unprivileged user (the
# "nonroot" id of distroless images); the store needs no privilege.
USER 65532:65532

# The store's bbolt files and raft log; kept across container restarts.
VOLUME /data

# gRPC (clients and raft between stores) and the status HTTP endpoint
# (/metrics, /status, /debug/pprof), as the compose file configures them.
EXPOSE 20160 20180

ENTRYPOINT ["/hedgekv"]
CMD ["help"]
