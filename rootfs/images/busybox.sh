#!/usr/bin/env bash
# Image "busybox": the host's static busybox and nothing else; tiny and fast to build.
#
# Usage: busybox.sh DEST_DIR   (DEST_DIR should be empty; no network needed)
set -euo pipefail

dest=${1:?usage: busybox.sh DEST_DIR}
bb=/bin/busybox

[[ -x $bb ]] || { echo "$bb is missing: apt-get install busybox-static" >&2; exit 1; }
# A dynamically linked busybox would need the host's libc inside the image.
if ldd "$bb" >/dev/null 2>&1; then
	echo "$bb is dynamically linked: apt-get install busybox-static" >&2
	exit 1
fi

mkdir -p "$dest"/{bin,etc,root,proc,sys,dev,tmp,usr/bin,usr/sbin,sbin,var/tmp}
chmod 0700 "$dest/root"
chmod 1777 "$dest/tmp" "$dest/var/tmp"
install -m 0755 "$bb" "$dest/bin/busybox"

# Same result as `busybox --install -s /bin`, but with relative links that do not
# depend on where busybox finds itself at build time.
"$bb" --list | while read -r applet; do
	[[ $applet == busybox ]] || ln -sfn busybox "$dest/bin/$applet"
done

cat >"$dest/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat >"$dest/etc/group" <<'GROUP'
root:x:0:
nogroup:x:65534:
GROUP
echo sandbox >"$dest/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost\n' >"$dest/etc/hosts"
: >"$dest/etc/resolv.conf"
echo "done: $("$bb" --list | wc -l) applets"
