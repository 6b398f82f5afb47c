/*
 * The freestanding test guest: proves that the VMM boots a 64-bit guest, gives
 * it the vCPUs and memory it was asked for, carries its serial output, and
 * returns its exit code. Under kvm_pvm every guest instruction may go through
 * KVM's instruction emulator (a few million per second), so the work here is
 * kept to a few thousand instructions: no loops over memory, no polling.
 *
 * Serial lines (the tests match them; keep them stable):
 *   guest: up vcpus=N mem_mib=M
 *   guest: mem top=0xADDR rw=ok|FAIL beyond=absent|PRESENT
 *   (with virtio devices in the boot-info block, devices.c's lines here)
 *   guest: exit N
 *
 * Command-line words (boot_info.cmdline): exit=N (exit code, default 0),
 * reset (i8042 reset instead of the exit port), fault (triple fault),
 * hang (halt forever with interrupts off; for the VMM's timeout),
 * touch=N (write one byte in each page of the N MiB above the image before
 * the device work, so the VM has N MiB of touched memory for the snapshot
 * benchmark; prints "guest: touched N MiB").
 */
#include "guest.h"

#define EXIT_BAD_BOOT_INFO 2
#define EXIT_MEM_CHECK_FAILED 3

static inline void outb(unsigned short port, unsigned char value)
{
	__asm__ volatile("outb %0, %1" : : "a"(value), "Nd"(port));
}

void put_char(char c)
{
	/* No LSR polling: the VMM's 16550 is always ready, and every port
	 * access is a VM exit. */
	outb(SERIAL_PORT, (unsigned char)c);
}

void put_str(const char *s)
{
	while (*s)
		put_char(*s++);
}

void put_dec(unsigned long v)
{
	char buf[20];
	int n = 0;

	do {
		buf[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n)
		put_char(buf[--n]);
}

void put_hex(unsigned long v)
{
	int shift = 60;

	put_str("0x");
	while (shift > 0 && ((v >> shift) & 0xf) == 0)
		shift -= 4;
	for (; shift >= 0; shift -= 4)
		put_char("0123456789abcdef"[(v >> shift) & 0xf]);
}

static __attribute__((noreturn)) void halt_forever(void)
{
	for (;;)
		__asm__ volatile("cli; hlt");
}

__attribute__((noreturn)) void guest_exit(unsigned char code)
{
	put_str("guest: exit ");
	put_dec(code);
	put_char('\n');
	outb(EXIT_PORT, code);
	/* The VMM stops all vCPUs on the write above; should it not, halting
	 * still ends this vCPU's work. */
	halt_forever();
}

static __attribute__((noreturn)) void triple_fault(void)
{
	static const struct __attribute__((packed)) {
		unsigned short limit;
		unsigned long base;
	} empty_idt = { 0, 0 };

	put_str("guest: triple fault\n");
	/* With an empty IDT the invalid-opcode fault cannot be delivered, nor can the
	 * resulting #GP or #DF: the CPU shuts down. */
	__asm__ volatile("lidt %0; ud2" : : "m"(empty_idt));
	halt_forever();
}

/* Does the word at s (length n) equal w? */
static int word_is(const char *s, unsigned long n, const char *w)
{
	unsigned long i = 0;

	for (; i < n && w[i]; i++)
		if (s[i] != w[i])
			return 0;
	return i == n && w[i] == 0;
}

static int starts_with(const char *s, unsigned long n, const char *prefix)
{
	unsigned long i = 0;

	for (; prefix[i]; i++)
		if (i >= n || s[i] != prefix[i])
			return 0;
	return 1;
}

/*
 * Writes and reads back the last byte of RAM below the MMIO gap (it must be
 * RAM) and the first byte after it (it must not be: with no device there the
 * write is dropped and the read returns all ones).
 */
static int check_memory(const struct boot_info *bi)
{
	volatile unsigned char *last = (volatile unsigned char *)(bi->low_ram_end - 1);
	volatile unsigned char *beyond = (volatile unsigned char *)bi->low_ram_end;
	int rw_ok, beyond_absent;

	*last = 0xa5;
	rw_ok = *last == 0xa5;
	*last = 0x5a;
	rw_ok = rw_ok && *last == 0x5a;

	*beyond = 0xa5;
	beyond_absent = *beyond != 0xa5;

	put_str("guest: mem top=");
	put_hex(bi->low_ram_end);
	put_str(rw_ok ? " rw=ok" : " rw=FAIL");
	put_str(beyond_absent ? " beyond=absent\n" : " beyond=PRESENT\n");
	return rw_ok && beyond_absent;
}

/* The value of the cmdline word `name=N` (decimal), or 0 without it. */
static unsigned long cmdline_number(const struct boot_info *bi, const char *name)
{
	const char *cmd = (const char *)bi->cmdline_addr;
	const char *end = cmd + bi->cmdline_len;
	unsigned long v = 0, n, plen = 0;

	while (name[plen])
		plen++;
	while (cmd < end) {
		const char *w = cmd;

		while (cmd < end && *cmd != ' ')
			cmd++;
		n = (unsigned long)(cmd - w);
		if (starts_with(w, n, name))
			for (v = 0, w += plen, n -= plen; n && *w >= '0' && *w <= '9'; w++, n--)
				v = v * 10 + (unsigned long)(*w - '0');
		while (cmd < end && *cmd == ' ')
			cmd++;
	}
	return v;
}

/* touch=N: one byte per page above the image, clamped to low RAM. */
static void touch_memory(const struct boot_info *bi)
{
	extern char guest_image_end[];
	unsigned long mib = cmdline_number(bi, "touch="), addr, end;

	if (!mib)
		return;
	addr = ((unsigned long)guest_image_end + 4095) & ~4095ul;
	end = addr + (mib << 20);
	if (end > bi->low_ram_end || end < addr)
		end = bi->low_ram_end;
	for (; addr < end; addr += 4096)
		*(volatile unsigned char *)addr = 1;
	put_str("guest: touched ");
	put_dec(mib);
	put_str(" MiB\n");
}

__attribute__((noreturn)) void guest_main(const struct boot_info *bi)
{
	const char *cmd, *end;
	unsigned char code = 0;

	if (bi->magic != BOOT_INFO_MAGIC || bi->version != BOOT_INFO_VERSION) {
		put_str("guest: bad boot info\n");
		guest_exit(EXIT_BAD_BOOT_INFO);
	}

	put_str("guest: up vcpus=");
	put_dec(bi->vcpus);
	put_str(" mem_mib=");
	put_dec(bi->mem_bytes >> 20);
	put_char('\n');

	if (!check_memory(bi))
		guest_exit(EXIT_MEM_CHECK_FAILED);

	touch_memory(bi);

	/* Device work only when the VMM gave devices, so a plain boot stays a
	 * few thousand instructions. serve_vsock returns only without vsock. */
	if (bi->virtio_count) {
		run_block_checks(bi);
		net_init(bi);
		serve_vsock(bi);
	}

	cmd = (const char *)bi->cmdline_addr;
	end = cmd + bi->cmdline_len;
	while (cmd < end) {
		const char *w = cmd;
		unsigned long n;

		while (cmd < end && *cmd != ' ')
			cmd++;
		n = (unsigned long)(cmd - w);
		if (starts_with(w, n, "exit=")) {
			code = 0;
			for (w += 5, n -= 5; n && *w >= '0' && *w <= '9'; w++, n--)
				code = (unsigned char)(code * 10 + (*w - '0'));
		} else if (word_is(w, n, "reset")) {
			put_str("guest: reset\n");
			outb(I8042_COMMAND_PORT, I8042_CMD_RESET);
			halt_forever();
		} else if (word_is(w, n, "fault")) {
			triple_fault();
		} else if (word_is(w, n, "hang")) {
			put_str("guest: hang\n");
			halt_forever();
		}
		while (cmd < end && *cmd == ' ')
			cmd++;
	}
	guest_exit(code);
}
