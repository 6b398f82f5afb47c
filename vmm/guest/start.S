/*
 * Entry point of the test guest. The VMM enters here in 64-bit long mode with
 * identity-mapped boot page tables, interrupts off, and %rdi holding the
 * guest-physical address of the boot-info block. The guest switches to its own
 * stack so it depends on no stack the VMM may or may not set up.
 */
	.section .text.start, "ax"
	.globl _start
	.code64
_start:
	lea stack_top(%rip), %rsp
	call guest_main
	/* guest_main does not return; if it ever does, park the CPU. */
1:	cli
	hlt
	jmp 1b

	.section .bss
	.balign 16
stack:
	.skip 4096
stack_top:
	.section .note.GNU-stack, "", @progbits
