#!/bin/sh
# Builds the freestanding test guest into OUT_DIR/test-guest.elf:
#   vmm/guest/build.sh OUT_DIR
# vmm/build.rs runs it for every cargo build of the vmm crate; run it by hand
# to get the guest outside cargo (e.g. to boot it under QEMU for comparison).
# CC_GUEST picks the compiler (default gcc).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR}
cc=${CC_GUEST:-gcc}
mkdir -p "$out"
flags="-m64 -O2 -ffreestanding -nostdlib -fno-pic -no-pie -static -mno-red-zone
 -mgeneral-regs-only -fno-stack-protector -fno-asynchronous-unwind-tables
 -fcf-protection=none -Wall -Wextra"
# shellcheck disable=SC2086 # $flags is a word list
$cc $flags -Wl,--build-id=none -Wl,--no-warn-rwx-segments -Wl,-T,"$here/guest.ld" \
	-o "$out/test-guest.elf" "$here/start.S" "$here/note.S" "$here/guest.c" "$here/virtio.c" \
	"$here/devices.c" "$here/net.c" "$here/agent.c" "$here/irq.c" "$here/pvh.c"
echo "$out/test-guest.elf"
