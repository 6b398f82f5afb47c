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

/*
 * Interrupt handlers (irq.c installs them). The device interrupt only has to
 * end: the wait loop that halted polls its queue again. EOI goes to the
 * local APIC's xAPIC MMIO register; the spurious vector needs none.
 */
	.text
	.globl irq_entry
irq_entry:
	push %rax
	mov $0xfee000b0, %eax
	movl $0, (%rax)
	pop %rax
	iretq

	.globl spurious_entry
spurious_entry:
	iretq

	.section .bss
	.balign 16
stack:
	.skip 4096
stack_top:
	.section .note.GNU-stack, "", @progbits
