/*
 * The PVH boot path's C half: turns QEMU's (or any PVH loader's)
 * struct hvm_start_info into the boot-info block guest_main expects, so a
 * PVH boot prints the same lines as a boot by sandboxd's VMM. Only
 * start.S's pvh_start calls this.
 */
#include "guest.h"

#define HVM_START_MAGIC 0x336ec578u /* "xEn3" */
#define HVM_MEMMAP_TYPE_RAM 1u
#define EXIT_BAD_PVH 2
/* start.S's PVH page tables map the first 1 GiB. */
#define PVH_MAPPED_BYTES (1ul << 30)
#define FOUR_GIB (1ul << 32)

/* xen/include/public/arch-x86/hvm/start_info.h, version 1. */
struct hvm_start_info {
	unsigned int magic;
	unsigned int version;
	unsigned int flags;
	unsigned int nr_modules;
	unsigned long modlist_paddr;
	unsigned long cmdline_paddr;
	unsigned long rsdp_paddr;
	unsigned long memmap_paddr;   /* version >= 1 */
	unsigned int memmap_entries;  /* version >= 1 */
	unsigned int reserved;
};

struct hvm_memmap_entry {
	unsigned long addr;
	unsigned long size;
	unsigned int type;
	unsigned int reserved;
};

static struct boot_info pvh_boot_info;

static __attribute__((noreturn)) void pvh_fail(const char *why)
{
	put_str("guest: pvh ");
	put_str(why);
	put_char('\n');
	guest_exit(EXIT_BAD_PVH);
}

__attribute__((noreturn)) void pvh_main(const struct hvm_start_info *si)
{
	struct boot_info *bi = &pvh_boot_info;
	const struct hvm_memmap_entry *map;
	unsigned long high_ram = 0;
	unsigned int i;

	if (si->magic != HVM_START_MAGIC)
		pvh_fail("bad hvm_start_info magic");
	if (si->version < 1 || !si->memmap_paddr || !si->memmap_entries)
		pvh_fail("no memory map (hvm_start_info version 1 needed)");

	/* Low RAM ends where the highest RAM range below 4 GiB ends (the
	 * ranges below 1 MiB have holes, so sizes are not summed there); RAM
	 * above 4 GiB counts in full. */
	map = (const struct hvm_memmap_entry *)si->memmap_paddr;
	for (i = 0; i < si->memmap_entries; i++) {
		unsigned long end = map[i].addr + map[i].size;

		if (map[i].type != HVM_MEMMAP_TYPE_RAM)
			continue;
		if (end <= FOUR_GIB) {
			if (end > bi->low_ram_end)
				bi->low_ram_end = end;
		} else {
			high_ram += map[i].size;
		}
	}
	/* check_memory also touches the byte after low RAM. */
	if (bi->low_ram_end >= PVH_MAPPED_BYTES)
		pvh_fail("boot maps only the first 1 GiB: give the VM less than 1024 MiB");

	bi->magic = BOOT_INFO_MAGIC;
	bi->version = BOOT_INFO_VERSION;
	/* The AP count would need ACPI (MADT) parsing; the benchmark runs one
	 * vCPU, and guest_main only prints this. */
	bi->vcpus = 1;
	bi->mem_bytes = bi->low_ram_end + high_ram;
	if (si->cmdline_paddr) {
		const char *c = (const char *)si->cmdline_paddr;

		bi->cmdline_addr = si->cmdline_paddr;
		while (c[bi->cmdline_len])
			bi->cmdline_len++;
	}
	/* No virtio devices: the boot-info path lists sandboxd's MMIO windows,
	 * which a PVH loader does not provide. */
	guest_main(bi);
}
