/* What guest.c offers the drivers: serial output and the exit port. */
#ifndef SANDBOXD_GUEST_H
#define SANDBOXD_GUEST_H

#include "boot_info.h"

void put_char(char c);
void put_str(const char *s);
void put_dec(unsigned long v);
void put_hex(unsigned long v);
__attribute__((noreturn)) void guest_exit(unsigned char code);
/* The checks and device work, from either entry (start.S, pvh.c). */
__attribute__((noreturn)) void guest_main(const struct boot_info *bi);

/* devices.c: the block checks and the vsock echo server. */
void run_block_checks(const struct boot_info *bi);
/* Serves vsock port 1024 until a connection sends "quit"; returns only if
 * there is no vsock device. */
void serve_vsock(const struct boot_info *bi);

#endif
