# Multi-stage image: build on Debian 12 with the project's own setup script, ship the agent only.
# Build: podman build --isolation chroot -t parascope .   (x86_64; the BPF programs build against
# the pinned bpf/vmlinux/x86_64/vmlinux.h, so the build host needs no kernel BTF; CO-RE makes the
# result portable to BTF kernels 5.10+)
# Run:   podman run --privileged --pid=host -v /sys/kernel/debug:/sys/kernel/debug parascope
FROM docker.io/library/debian:12 AS build
WORKDIR /src
COPY scripts/setup scripts/setup
RUN bash scripts/setup
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF \
 && cmake --build build -j"$(nproc)" --target parascope \
 && strip build/bin/parascope

FROM docker.io/library/debian:12-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
      libbpf1 libelf1 zlib1g libprotobuf32 \
      libabsl20220623 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/bin/parascope /usr/local/bin/parascope
ENTRYPOINT ["/usr/local/bin/parascope"]
