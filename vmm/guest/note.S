/*
 * The ELF note that tells the VMM this image speaks the private boot-info
 * protocol (boot_info.h): without it the VMM would boot the image as a Linux
 * kernel. It lives in its own section so that other notes (a Xen PVH entry
 * note, for QEMU) can sit beside it in the same PT_NOTE segment.
 */
#include "boot_info.h"

	.section .note.sandboxd, "a", @note
	.balign 4
	.long 2f - 1f			/* namesz, terminator included */
	.long 4f - 3f			/* descsz */
	.long SANDBOXD_NOTE_BOOT_INFO	/* type */
1:	.asciz SANDBOXD_NOTE_NAME
2:	.balign 4
3:	.long BOOT_INFO_VERSION
4:	.balign 4

	.section .note.GNU-stack, "", @progbits
