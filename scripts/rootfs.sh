#!/usr/bin/env bash
# Assembles sluice's container root filesystem in DEST from Debian bookworm's own packages: the
# C library and libgcc (all the release binary links to: `ldd target/release/sluice`), tzdata,
# the CA bundle, a non-root user (65532, as distroless's `nonroot`), the binary and the
# container configuration. Nothing else: no shell, no package manager, no coreutils.
#
# Run by the Containerfile's build stage, and by scripts/container.sh on a Debian host where
# base images cannot be pulled (the same packages from the same mirror, so the same files).
# usage: scripts/rootfs.sh DEST BINARY
set -euo pipefail
dest=$1 binary=$2
cd "$(dirname "$0")/.."
packages=(libc6 libgcc-s1 tzdata)
[ -e /etc/ssl/certs/ca-certificates.crt ] || { echo "rootfs.sh: no /etc/ssl/certs/ca-certificates.crt (apt-get install ca-certificates)" >&2; exit 1; }
debs=$(mktemp -d)
trap 'rm -rf "$debs"' EXIT
chmod 0777 "$debs"   # apt fetches as its _apt user
(cd "$debs" && apt-get download -qq "${packages[@]}")
rm -rf "$dest" && mkdir -p "$dest"
for deb in "$debs"/*.deb; do
  dpkg-deb -x "$deb" "$dest"
  dpkg-deb -W --showformat='${Package} ${Version}\n' "$deb" >> "$debs/packages.txt"
done

install -D -m 0644 "$debs/packages.txt" "$dest/usr/share/sluice/debian-packages.txt"
# What the packages' maintainer scripts would have done, for what sluice uses.
ln -sf /usr/share/zoneinfo/Etc/UTC "$dest/etc/localtime"
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$dest/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$dest/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$dest/etc/group"
install -d -m 0700 "$dest/home/nonroot"
install -d -m 1777 "$dest/tmp"
# Mount points: a container runtime mounts these; scripts/container-test.sh's chroot does too.
install -d -m 0755 "$dest/proc" "$dest/sys" "$dest/dev"
touch "$dest/dev/null" "$dest/dev/zero" "$dest/dev/urandom"
# The runtime directory (pid file, upgrade socket), /run/sluice: the Containerfile creates it
# owned by nonroot from this empty directory (a tmpfs or an emptyDir is mounted there when the
# root filesystem is read-only).
install -d -m 0755 "$dest/run" "$dest/usr/share/sluice/empty"
chown 65532:65532 "$dest/home/nonroot" 2>/dev/null || true
install -D -m 0755 "$binary" "$dest/usr/bin/sluice"
install -D -m 0644 conf/container.yaml "$dest/etc/sluice/sluice.yaml"
# Not needed at run time.
rm -rf "$dest/usr/share/doc"/*/changelog* "$dest/usr/share/lintian" "$dest/usr/share/locale"
if find "$dest" -name sh -o -name bash -o -name dash | grep -q .; then
  echo "rootfs.sh: a shell slipped into $dest" >&2; exit 1
fi
echo "rootfs.sh: $dest: $(du -sh "$dest" | cut -f1) ($(paste -sd, "$dest/usr/share/sluice/debian-packages.txt"))"
