# parascope's container image, two stages: the agent is built on Debian 12 with the project's own
# setup script, and the runtime stage holds Debian 12 minbase plus exactly the packages that own
# the shared libraries the binary loads (scripts/runtime-packages derives them with ldd; plus
# libdebuginfod.so.1, which it loads with dlopen for --debuginfod-urls).
#
#   sudo make image        podman build --isolation chroot from a local debootstrap base (no
#                          Docker engine, no registry): localhost/parascope:latest
#   sudo make test-image   runs the agent from the image's root filesystem and checks profiles
#
# The BPF programs build against the pinned bpf/vmlinux/x86_64/vmlinux.h, so the build host needs
# no kernel BTF; CO-RE makes the result run on BTF kernels 5.10+. The agent runs as uid 65534 with
# file capabilities of exactly the measured set (README "Running as a systemd service"); in
# Kubernetes the pod adds the same six to the container's bounding set
# (deploy/kubernetes/daemonset.yaml), and allowPrivilegeEscalation must stay true for file
# capabilities to apply.
ARG BASE=docker.io/library/debian:12

FROM ${BASE} AS build
WORKDIR /src
COPY scripts/setup scripts/setup
RUN bash scripts/setup --build && rm -rf /var/lib/apt/lists/*
COPY . .
RUN rm -rf build \
 && cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo \
 && cmake --build build -j"$(nproc)" --target parascope \
 && strip --strip-debug build/bin/parascope \
 && bash scripts/runtime-packages build/bin/parascope libdebuginfod.so.1 > /runtime-packages

FROM ${BASE}
COPY --from=build /runtime-packages /usr/share/parascope/runtime-packages
# libcap2-bin only for setcap, purged below. The upgrade brings the base's packages to
# bookworm-security's versions (the local debootstrap base has the point release's). apt's package
# lists, caches and downloaded .debs are removed in the layer that made them (90 MB otherwise).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      $(cat /usr/share/parascope/runtime-packages) libcap2-bin \
 && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y --no-install-recommends \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY --from=build /src/build/bin/parascope /usr/local/bin/parascope
COPY deploy/config.example.yaml /usr/share/doc/parascope/config.example.yaml
RUN setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search,cap_syslog,cap_checkpoint_restore=ep \
      /usr/local/bin/parascope \
 && DEBIAN_FRONTEND=noninteractive apt-get purge -y --auto-remove libcap2-bin \
 && apt-get clean && rm -rf /var/cache/apt/*.bin \
 && if ldd /usr/local/bin/parascope | grep "not found"; then exit 1; fi
USER 65534:65534
EXPOSE 7070
# /healthz over bash's /dev/tcp: the image has no HTTP client binary.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
  CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/7070 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && head -1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/usr/local/bin/parascope"]
CMD ["--http-address=0.0.0.0:7070"]
# Last, so that a new version or revision does not invalidate the layers above.
ARG VERSION=dev
ARG REVISION=
LABEL org.opencontainers.image.title="parascope" \
      org.opencontainers.image.description="Continuous eBPF profiler: CPU, off-CPU, wall and latency profiles in pprof, pushed to Pyroscope" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="debian:12"
