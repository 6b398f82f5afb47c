/*
 * Interrupts for the test guest, so that an idle guest halts instead of
 * spinning: under kvm_pvm a spinning vCPU is KVM's instruction emulator
 * running flat out on a host core, and ten idle VMs would take the host.
 *
 * One vector is used: a virtio device's GSI is routed through the in-kernel
 * IOAPIC (edge, fixed delivery, to APIC ID 0, which is the vCPU that runs
 * the guest's code) to IRQ_VECTOR, whose handler only acknowledges the local
 * APIC. The wait loop re-checks the used ring after each wake-up, so a
 * spurious or shared interrupt costs one poll. The 8259 PICs are masked:
 * their default vector base would make an interrupt look like an exception.
 */
#include "guest.h"

#define IRQ_VECTOR 0x30
#define SPURIOUS_VECTOR 0xff
#define IOAPIC_BASE 0xfec00000ul
#define LAPIC_BASE 0xfee00000ul
#define LAPIC_SVR 0xf0
#define LAPIC_SVR_ENABLE 0x100u
#define PIC1_DATA 0x21
#define PIC2_DATA 0xa1

struct idt_gate {
	unsigned short offset_lo;
	unsigned short selector;
	unsigned char ist;
	unsigned char type_attr;
	unsigned short offset_mid;
	unsigned int offset_hi;
	unsigned int zero;
} __attribute__((packed));

static struct idt_gate idt[256] __attribute__((aligned(16)));
static int irq_ready;

/* start.S */
extern void irq_entry(void);
extern void spurious_entry(void);

static inline void outb(unsigned short port, unsigned char value)
{
	__asm__ volatile("outb %0, %1" : : "a"(value), "Nd"(port));
}

static void set_gate(int vector, void (*handler)(void))
{
	unsigned long addr = (unsigned long)handler;
	unsigned short cs;

	__asm__ volatile("mov %%cs, %0" : "=r"(cs));
	idt[vector].offset_lo = (unsigned short)addr;
	idt[vector].selector = cs;
	idt[vector].ist = 0;
	idt[vector].type_attr = 0x8e; /* present, ring 0, 64-bit interrupt gate */
	idt[vector].offset_mid = (unsigned short)(addr >> 16);
	idt[vector].offset_hi = (unsigned int)(addr >> 32);
	idt[vector].zero = 0;
}

static void ioapic_write(unsigned int reg, unsigned int value)
{
	*(volatile unsigned int *)IOAPIC_BASE = reg;
	*(volatile unsigned int *)(IOAPIC_BASE + 0x10) = value;
}

static void irq_setup(void)
{
	volatile unsigned int *svr = (volatile unsigned int *)(LAPIC_BASE + LAPIC_SVR);
	struct {
		unsigned short limit;
		unsigned long base;
	} __attribute__((packed)) idtr;

	set_gate(IRQ_VECTOR, irq_entry);
	set_gate(SPURIOUS_VECTOR, spurious_entry);
	idtr.limit = sizeof(idt) - 1;
	idtr.base = (unsigned long)idt;
	__asm__ volatile("lidt %0" : : "m"(idtr));
	outb(PIC1_DATA, 0xff);
	outb(PIC2_DATA, 0xff);
	*svr = LAPIC_SVR_ENABLE | SPURIOUS_VECTOR;
	irq_ready = 1;
}

void irq_route(unsigned int gsi)
{
	if (!irq_ready)
		irq_setup();
	/* High word first, so the entry is never live with a stale destination. */
	ioapic_write(0x11 + 2 * gsi, 0);
	ioapic_write(0x10 + 2 * gsi, IRQ_VECTOR);
}

#define LAPIC_LVT_TIMER 0x320
#define LAPIC_TIMER_INIT 0x380
#define LAPIC_TIMER_CUR 0x390
#define LAPIC_TIMER_DIV 0x3e0

/* A one-shot local APIC timer on the same vector, to bound a wait: after
 * `count` APIC bus cycles (1 GHz under KVM, divide by 1) it interrupts and
 * irq_timer_left() reads 0. irq_route must have run first. */
void irq_timer_start(unsigned int count)
{
	*(volatile unsigned int *)(LAPIC_BASE + LAPIC_TIMER_DIV) = 0xb;
	*(volatile unsigned int *)(LAPIC_BASE + LAPIC_LVT_TIMER) = IRQ_VECTOR;
	*(volatile unsigned int *)(LAPIC_BASE + LAPIC_TIMER_INIT) = count;
}

unsigned int irq_timer_left(void)
{
	return *(volatile unsigned int *)(LAPIC_BASE + LAPIC_TIMER_CUR);
}

void irq_timer_stop(void)
{
	*(volatile unsigned int *)(LAPIC_BASE + LAPIC_TIMER_INIT) = 0;
}
