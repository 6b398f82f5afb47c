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

/* Sector I/O on disk n (boot-info order among disks) of 512 bytes at buf; a
 * write is flushed. Returns the virtio status (0: done), or 0xff when there
 * is no such disk. */
unsigned int guest_blk_sector(int n, unsigned long sector, unsigned char *buf, int write);

/* devices.c: sends on the agent's vsock connection, if it is up. */
void agent_link_send(const void *data, unsigned int len);

/* agent.c: the agent protocol over that connection. agent_data returns -1
 * when the host broke the framing, and the link is then reset. */
void agent_init(const struct boot_info *bi);
void agent_connected(void);
int agent_data(const unsigned char *data, unsigned int len);

/* irq.c: routes a GSI to the guest's one interrupt vector (setting up the
 * IDT and local APIC the first time). */
void irq_route(unsigned int gsi);
/* irq.c: a one-shot local APIC timer on that vector, to bound a wait. */
void irq_timer_start(unsigned int count);
unsigned int irq_timer_left(void);
void irq_timer_stop(void);

/* net.c: the virtio-net driver, only with a net device listed. */
void net_init(const struct boot_info *bi);
/* Sends a TCP SYN from 10.201.0.2 to ip:port (ip in host order) through
 * the gateway 10.201.0.1 (its MAC learnt once by ARP) and waits (bounded)
 * for the answer. Returns NET_SYNACK (an RST was sent back), NET_RST (the
 * peer refused), NET_NO_ANSWER, NET_NO_ARP (the gateway did not answer
 * ARP) or NET_NO_DEVICE. */
enum { NET_SYNACK = 0, NET_RST = 1, NET_NO_ANSWER = 2, NET_NO_ARP = 3, NET_NO_DEVICE = 4,
       NET_FIN = 5, NET_DATA = 6 };
int net_syn(unsigned int ip, unsigned int port);
/* Completes a TCP handshake with ip:port and waits (bounded) for how the
 * peer goes on: NET_FIN (it closed before sending anything: a proxy that
 * refused the connection), NET_DATA (it sent bytes), NET_RST, NET_SYNACK
 * (connected and still open when the wait ended), or the net_syn
 * failures. The connection is reset before returning. */
int net_connect(unsigned int ip, unsigned int port);
/* Answers the first TCP connection to `port` of the guest's address: a
 * SYN-ACK, then `reply` (at most 256 bytes) with FIN once the request's
 * first bytes came, then an ACK of the peer's FIN. Bounded waits. Returns
 * NET_DATA once the reply went out, NET_NO_ANSWER when no request came,
 * or NET_NO_DEVICE. */
int net_serve(unsigned int port, const char *reply, unsigned int reply_len);

#endif
