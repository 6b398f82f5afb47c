/*
 * The boot-info block the VMM writes into guest memory for the test guest
 * (vmm/src/arch/x86_64/boot_info.rs is the other half; keep them in step).
 * It is the test guest's stand-in for Linux's boot_params: the smallest
 * description of the machine that lets the guest check what it was given.
 */
#ifndef SANDBOXD_BOOT_INFO_H
#define SANDBOXD_BOOT_INFO_H

#define BOOT_INFO_MAGIC 0x42584253u /* "SBXB", little endian */
/* Plain (no u suffix): note.S hands it to the assembler. */
#define BOOT_INFO_VERSION 2
#define BOOT_INFO_MAX_VIRTIO 8

/*
 * The ELF note by which the guest asks for this block instead of a Linux boot
 * protocol (note.S emits it; vmm/src/loader/notes.rs reads it): owner
 * "sandboxd", this type, and BOOT_INFO_VERSION as a 4-byte descriptor.
 */
#define SANDBOXD_NOTE_NAME "sandboxd"
#define SANDBOXD_NOTE_BOOT_INFO 1

#ifndef __ASSEMBLER__
/* One virtio-mmio device (there is no ACPI or device tree). */
struct boot_virtio {
	unsigned long base;          /* guest-physical base of its 4 KiB registers */
	unsigned int gsi;            /* its interrupt line (unused: the guest polls) */
	unsigned int device_type;    /* virtio device ID */
};

#define VIRTIO_ID_NET 1u
#define VIRTIO_ID_BLOCK 2u
#define VIRTIO_ID_VSOCK 19u

struct boot_info {
	unsigned int magic;
	unsigned int version;
	unsigned int vcpus;          /* KVM vCPUs created for this VM */
	unsigned int reserved;
	unsigned long mem_bytes;     /* guest RAM in total */
	unsigned long low_ram_end;   /* end (exclusive) of RAM below the MMIO gap */
	unsigned long cmdline_addr;  /* guest-physical address of the command line */
	unsigned long cmdline_len;   /* its length in bytes, no terminator */
	unsigned int virtio_count;   /* entries used in virtio[] */
	unsigned int reserved2;
	struct boot_virtio virtio[BOOT_INFO_MAX_VIRTIO];
};
#endif

/* I/O ports the guest talks to. */
#define SERIAL_PORT 0x3f8      /* COM1 data register (16550) */
#define EXIT_PORT 0xf4         /* one-byte write = exit code */
#define I8042_COMMAND_PORT 0x64
#define I8042_CMD_RESET 0xfe

#endif
