#!/usr/bin/env bash
# Installs CRIU 4.2.1 as /usr/local/sbin/criu on Debian 12, as root, unless a
# working CRIU >= 4.2 is already first on PATH.
#
# Debian bookworm's criu 3.17 fails on kernels >= 6.13 ("kerndat_vdso_fill_symtable
# failed": the vvar area was split; fixed in CRIU 4.1). CRIU 4.1.x (Debian
# trixie's 4.1.1) passes `criu check` on 6.16+ kernels but cannot dump any
# TCP/UDP socket there ("sockets: Can't get 1:16 opt: Operation not supported":
# the kernel now refuses SO_PASSCRED/SO_PASSSEC on inet sockets; fixed in 4.2).
# So this builds the upstream tarball of Debian testing's criu 4.2.1 source
# package (criu_4.2.1.orig.tar.xz, checked against the signed Sources index),
# which builds on bookworm with `make criu`. Only the host's Debian mirror is
# contacted. The source is fetched through a private apt configuration (a
# deb-src entry in a temporary directory), so nothing under /etc/apt or
# /var/lib/apt changes and there is nothing to undo even if this is interrupted.
# CRIU_VERSION overrides the version (it must be in one of $suites' Sources).
#
# Idempotent: a working install exits at once; a finished build in the cache
# dir (CRIU_BUILD_DIR, default /var/cache/sandboxd-build) is reused.
set -euo pipefail

version=${CRIU_VERSION:-4.2.1}     # upstream version of a criu $version-* source package
suites="forky sid"                 # where Debian has it (testing, unstable)
min_version=4.2
cache=${CRIU_BUILD_DIR:-/var/cache/sandboxd-build}
src="$cache/criu-$version"
dest=/usr/local/sbin/criu

if ((EUID != 0)); then
  echo "install-criu.sh must run as root" >&2
  exit 1
fi

# Usable when it reports >= $min_version and `criu check` passes on this kernel.
criu_works() {
  local bin=$1 v
  [[ -x $bin ]] || return 1
  v=$("$bin" --version 2>/dev/null | awk '/^Version:/ { print $2; exit }') || return 1
  [[ -n $v ]] && dpkg --compare-versions "$v" ge "$min_version" || return 1
  "$bin" check >/dev/null 2>&1
}

for current in "$dest" "$(command -v criu || true)"; do
  if [[ -n $current ]] && criu_works "$current"; then
    echo "criu: $("$current" --version | awk '/^Version:/ { print $2 }') at $current works; nothing to do"
    exit 0
  fi
done
case ":$PATH:" in
  *:/usr/local/sbin:*) ;;
  *) echo "warning: /usr/local/sbin is not on PATH; sandboxd finds criu through PATH" >&2 ;;
esac

# Build dependencies (Debian's Build-Depends that `make criu` uses, on bookworm).
packages=(
  build-essential pkg-config python3 xz-utils ca-certificates
  libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler python3-protobuf
  libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev libnftables-dev uuid-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

suite=bookworm
# shellcheck source=../rootfs/lib/debian-mirror.sh
. "$(dirname "$0")/../rootfs/lib/debian-mirror.sh"

build_ok() { [[ -x $src/criu/criu ]] && "$src/criu/criu" --version 2>/dev/null | grep -q "^Version: $version\$"; }

if ! build_ok; then
  mkdir -p "$cache"
  tarball="$cache/criu_$version.orig.tar.xz"
  work=$(mktemp -d /tmp/install-criu.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  if [[ ! -s $tarball ]]; then
    mirror=$(debian_mirror "$suite") || exit 1
    echo "fetching criu $version (Debian source, $suites) from $mirror"
    mkdir -p "$work/sources.list.d" "$work/lists/partial" "$work/download"
    cat >"$work/sources.list.d/criu-src.sources" <<EOF
Types: deb-src
URIs: $mirror
Suites: $suites
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # A private apt: only this deb-src entry, its own lists, no shared caches.
    apt_private=(
      -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/sources.list.d"
      -o Dir::State::Lists="$work/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
      -o APT::Sandbox::User=root
    )
    apt-get "${apt_private[@]}" update -qq
    # The criu source record of version $version-* (paragraphs separated by blank lines).
    record=$(apt-cache "${apt_private[@]}" showsrc criu |
      awk -v v="$version" 'BEGIN { RS = "" } /^Package: criu\n/ && $0 ~ ("\nVersion: " v "-") { print; exit }') || true
    dir=$(awk '/^Directory:/ { print $2; exit }' <<<"$record")
    sha=$(awk -v f="criu_$version.orig.tar.xz" '/^Checksums-Sha256:/ { c = 1; next } /^[^ ]/ { c = 0 } c && $3 == f { print $1; exit }' <<<"$record")
    debver=$(awk '/^Version:/ { print $2; exit }' <<<"$record")
    if [[ -z $dir || -z $sha ]]; then
      echo "no criu $version-* with criu_$version.orig.tar.xz in $suites; available:" >&2
      apt-cache "${apt_private[@]}" showsrc criu | awk '/^Version:/ { print "  " $2 }' | sort -u >&2
      echo "set CRIU_VERSION to one of these (>= $min_version)" >&2
      exit 1
    fi
    # The Debian part (.debian.tar.xz) is not needed and may fail to download;
    # only the orig tarball counts, and it is checked against the signed index.
    (cd "$work/download" && apt-get "${apt_private[@]}" source --download-only -qq "criu=$debver" >/dev/null 2>&1) || true
    got="$work/download/criu_$version.orig.tar.xz"
    if ! [[ -s $got ]] || ! echo "$sha  $got" | sha256sum -c --quiet - 2>/dev/null; then
      echo "apt-get source did not give the tarball; fetching $mirror/$dir/criu_$version.orig.tar.xz"
      if command -v curl >/dev/null; then
        curl -fsSL -o "$got" "$mirror/$dir/criu_$version.orig.tar.xz"
      else
        /usr/lib/apt/apt-helper download-file "$mirror/$dir/criu_$version.orig.tar.xz" "$got" "SHA256:$sha"
      fi
      echo "$sha  $got" | sha256sum -c --quiet -
    fi
    mv "$got" "$tarball"
  fi

  echo "building criu $version in $src"
  rm -rf "$src"
  mkdir -p "$work/unpack"
  tar -C "$work/unpack" -xJf "$tarball"
  mv "$work/unpack/criu-$version" "$src"
  # `make criu` builds only the binary (no docs, plugins, crit or tests).
  if ! make -C "$src" -j"$(nproc)" criu >"$src/build.log" 2>&1; then
    tail -n 30 "$src/build.log" >&2
    echo "criu build failed; the full log is $src/build.log" >&2
    exit 1
  fi
  build_ok
fi

install -D -m 0755 "$src/criu/criu" "$dest"
if ! out=$("$dest" check 2>&1) || ! grep -q "Looks good" <<<"$out"; then
  echo "$out" >&2
  echo "criu $version was installed at $dest but \`criu check\` fails on this kernel" >&2
  exit 1
fi
if [[ $(command -v criu) != "$dest" ]]; then
  echo "warning: \`criu\` on PATH is $(command -v criu), not $dest" >&2
fi
echo "criu $version installed at $dest: $(tail -n 1 <<<"$out")"
