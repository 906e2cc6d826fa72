# The interlock image: `interlock` (agent and CLI) and `interlock-cni` (the plugin the
# agent installs onto the host), both static, on an empty base.
#
#   docker build --build-arg INTERLOCK_BUILD_COMMIT=$(git rev-parse --short=12 HEAD) \
#       -t <registry>/interlock:v<version> .
#
# The build steps are scripts/image-rootfs.sh, which a test runs on every CI run
# (crates/cli/tests/image.rs); this file itself is not built by the tests (no container
# engine runs there).

# Pinned by exact tag: the workspace's MSRV, on Debian 12.
FROM docker.io/library/rust:1.89.0-slim-bookworm AS build
# iptables: its legacy tools go into the image (scripts/image-rootfs.sh says why).
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler iptables \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# No .git in the context: the commit comes in as a build argument (empty: version only).
ARG INTERLOCK_BUILD_COMMIT=""
ENV INTERLOCK_BUILD_COMMIT=${INTERLOCK_BUILD_COMMIT}
RUN scripts/image-rootfs.sh /rootfs

# The two static binaries and Debian's iptables-legacy tools with the libraries they load:
# no shell, no package manager. `scratch` is the empty image, so there is nothing to pin;
# the iptables tools are patched with the build image.
FROM scratch
COPY --from=build /rootfs/ /
# The agent copies this file into the host's CNI bin dir (INTERLOCK_PLUGIN_SOURCE).
ENV INTERLOCK_PLUGIN_SOURCE=/usr/local/bin/interlock-cni
ENTRYPOINT ["/usr/local/bin/interlock"]
CMD ["agent"]
