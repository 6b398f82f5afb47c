/*
 * Entry points of the test guest.
 *
 * _start (the ELF entry): sandboxd's VMM enters here in 64-bit long mode with
 * identity-mapped boot page tables, interrupts off, and %rdi holding the
 * guest-physical address of the boot-info block. The guest switches to its own
 * stack so it depends on no stack the VMM may or may not set up.
 *
 * pvh_start (named by the .note.Xen PHYS32_ENTRY note): the Xen PVH boot
 * protocol, which QEMU (-kernel with an ELF) and other VMMs use. Entered in
 * 32-bit protected mode, paging off, flat segments, %ebx = the guest-physical
 * address of struct hvm_start_info. It exists so that the same ELF can be
 * booted by QEMU microvm for the boot-time comparison (vmm/benches/boot.rs);
 * sandboxd's VMM never takes it.
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

/* Page-table entry bits. */
#define PTE_P 0x1
#define PTE_RW 0x2
#define PTE_PS 0x80 /* in a page directory: a 2 MiB page */
#define PVH_PD_ENTRIES 512 /* one page directory: the first 1 GiB */

	.section .text, "ax"
	.globl pvh_start
	.code32
pvh_start:
	cli
	cld
	mov $stack_top, %esp
	/* Keep hvm_start_info's address; %esi is not touched below. */
	mov %ebx, %esi

	/*
	 * Identity-map the first 1 GiB with 2 MiB pages: PML4[0] -> PDPT,
	 * PDPT[0] -> PD, PD[i] -> i * 2 MiB. The tables are in .bss, so
	 * already zero; only the low halves of the used entries are written.
	 * One GiB and not four: every instruction may be emulated on the
	 * development host, and a 2048-entry loop would cost QEMU's run
	 * milliseconds. pvh_main refuses RAM that reaches 1 GiB.
	 */
	movl $(pvh_pdpt + PTE_P + PTE_RW), pvh_pml4
	movl $(pvh_pd + PTE_P + PTE_RW), pvh_pdpt
	mov $pvh_pd, %edi
	mov $(PTE_P + PTE_RW + PTE_PS), %eax
	mov $PVH_PD_ENTRIES, %ecx
2:	mov %eax, (%edi)
	add $0x200000, %eax
	add $8, %edi
	loop 2b

	/* Long mode: CR4.PAE, CR3, EFER.LME, then CR0.PG (PE is already on). */
	mov %cr4, %eax
	or $0x20, %eax
	mov %eax, %cr4
	mov $pvh_pml4, %eax
	mov %eax, %cr3
	mov $0xc0000080, %ecx
	rdmsr
	or $0x100, %eax
	wrmsr
	mov %cr0, %eax
	or $0x80000001, %eax
	mov %eax, %cr0

	lgdt pvh_gdt_desc
	ljmp $0x08, $pvh_long

	.code64
pvh_long:
	mov $0x10, %eax
	mov %eax, %ds
	mov %eax, %es
	mov %eax, %ss
	xor %eax, %eax
	mov %eax, %fs
	mov %eax, %gs
	/* Zero-extends hvm_start_info's 32-bit address into the first argument. */
	mov %esi, %edi
	call pvh_main
3:	cli
	hlt
	jmp 3b

	.section .rodata
	.balign 8
/* null, 64-bit code (selector 0x08), data (0x10). */
pvh_gdt:
	.quad 0
	.quad 0x00af9a000000ffff
	.quad 0x00cf92000000ffff
pvh_gdt_desc:
	.word pvh_gdt_desc - pvh_gdt - 1
	.long pvh_gdt

/*
 * The PVH entry note. The descriptor is 8 bytes (high half zero), as in
 * Linux's 64-bit kernel, because QEMU reads it as a host size_t from a 64-bit
 * ELF; the note is 4-byte aligned because QEMU aligns the name to the PT_NOTE
 * segment's p_align when it looks for the descriptor.
 */
	.section .note.Xen, "a", @note
	.balign 4
	.long 4                 /* n_namesz: "Xen\0" */
	.long 8                 /* n_descsz */
	.long 18                /* n_type: XEN_ELFNOTE_PHYS32_ENTRY */
	.asciz "Xen"
	.balign 4
	.quad pvh_start

	.section .bss
	.balign 16
stack:
	.skip 4096
stack_top:
	.balign 4096
pvh_pml4:
	.skip 4096
pvh_pdpt:
	.skip 4096
pvh_pd:
	.skip 4096
	.section .note.GNU-stack, "", @progbits
