/*
 * The test guest's virtio-net driver and the two things it does with it:
 * `net-syn` (agent.c), a TCP SYN to an address through the gateway and a
 * bounded wait for the answer, `net-connect`, a whole handshake and a
 * bounded wait for how the peer goes on (closes, sends, resets), and
 * `net-serve`, one HTTP answer to the first connection to a port of the
 * guest's (the host's ingress dialing in through the tap). Addresses are the sandbox's fixed ones: the
 * guest is 10.201.0.2 with the device's MAC (06:00:0a:c9:00:02 by default),
 * the gateway 10.201.0.1 (the host's tap), its MAC learnt with one ARP
 * request and cached.
 *
 * RX: 8 buffers of 1536 bytes (12-byte header + a 1514-byte frame) stay
 * posted; the device's interrupt wakes the wait (irq.c), which is bounded by
 * the local APIC timer (~2 s) and by a number of frames. TX: one chain, the
 * header and frame in one buffer, polled until the device took it. A few
 * thousand instructions per SYN.
 */
#include "guest.h"
#include "virtio.h"

#define NET_HDR 12
#define RX_SIZE 1536
#define NRX VQ_SIZE
#define MAX_FRAMES 32
#define WAIT_CYCLES 2000000000u

static struct vq net_q[2];
static unsigned char net_rx[NRX][RX_SIZE] __attribute__((aligned(16)));
#define MAX_PAYLOAD 256
static unsigned char net_tx[NET_HDR + 54 + MAX_PAYLOAD] __attribute__((aligned(16)));
static unsigned char my_mac[6], gw_mac[6];
static int net_up, gw_known;
static unsigned int syn_count;

static const unsigned int my_ip = (10u << 24) | (201u << 16) | 2u;

/* net_serve's wait: about twice net_syn's, and more frames (a client's
 * retransmissions and ACKs). */
#define SERVE_CYCLES 4000000000u
#define SERVE_FRAMES 64
enum { SERVE_LISTEN, SERVE_OPEN, SERVE_REPLIED };
static const unsigned int gw_ip = (10u << 24) | (201u << 16) | 1u;

static void put_mac(const unsigned char *m)
{
	static const char digits[] = "0123456789abcdef";
	int i;

	for (i = 0; i < 6; i++) {
		if (i)
			put_char(':');
		put_char(digits[m[i] >> 4]);
		put_char(digits[m[i] & 0xf]);
	}
}

static void post_rx(unsigned short i)
{
	net_q[0].desc[i].addr = (unsigned long)net_rx[i];
	net_q[0].desc[i].len = RX_SIZE;
	net_q[0].desc[i].flags = VRING_DESC_F_WRITE;
	net_q[0].desc[i].next = 0;
	vq_submit(&net_q[0], i);
}

void net_init(const struct boot_info *bi)
{
	const struct boot_virtio *d = 0;
	unsigned int i, features, w;

	for (i = 0; i < bi->virtio_count && i < BOOT_INFO_MAX_VIRTIO; i++)
		if (bi->virtio[i].device_type == VIRTIO_ID_NET)
			d = &bi->virtio[i];
	if (!d)
		return;
	if (virtio_init(d->base, VIRTIO_ID_NET, net_q, 2, &features)) {
		put_str("guest: net init FAIL\n");
		return;
	}
	w = virtio_config32(d->base, 0);
	for (i = 0; i < 4; i++)
		my_mac[i] = (unsigned char)(w >> (8 * i));
	w = virtio_config32(d->base, 4);
	my_mac[4] = (unsigned char)w;
	my_mac[5] = (unsigned char)(w >> 8);
	for (i = 0; i < NRX; i++)
		post_rx((unsigned short)i);
	irq_route(d->gsi);
	net_up = 1;
	put_str("guest: net mac=");
	put_mac(my_mac);
	put_char('\n');
}

static void be16(unsigned char *p, unsigned int v)
{
	p[0] = (unsigned char)(v >> 8);
	p[1] = (unsigned char)v;
}

static void be32(unsigned char *p, unsigned int v)
{
	be16(p, v >> 16);
	be16(p + 2, v & 0xffff);
}

static unsigned int rd16(const unsigned char *p)
{
	return ((unsigned int)p[0] << 8) | p[1];
}

static unsigned int rd32(const unsigned char *p)
{
	return (rd16(p) << 16) | rd16(p + 2);
}

static unsigned int sum16(const unsigned char *p, unsigned int n, unsigned int sum)
{
	unsigned int i;

	for (i = 0; i + 1 < n; i += 2)
		sum += rd16(p + i);
	if (n & 1)
		sum += (unsigned int)p[n - 1] << 8;
	return sum;
}

static unsigned int fold(unsigned int sum)
{
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return ~sum & 0xffff;
}

/* Sends the frame in net_tx (after the header) and waits until the device
 * took it. */
static void net_send(unsigned int frame_len)
{
	unsigned int i, len;

	for (i = 0; i < NET_HDR; i++)
		net_tx[i] = 0;
	net_q[1].desc[0].addr = (unsigned long)net_tx;
	net_q[1].desc[0].len = NET_HDR + frame_len;
	net_q[1].desc[0].flags = 0;
	net_q[1].desc[0].next = 0;
	vq_submit(&net_q[1], 0);
	vq_wait(&net_q[1], &len);
}

static void eth_header(unsigned char *f, const unsigned char *dst, unsigned int type)
{
	int i;

	for (i = 0; i < 6; i++) {
		f[i] = dst[i];
		f[6 + i] = my_mac[i];
	}
	be16(f + 12, type);
}

/* The next received frame (its start in *frame, its length returned), or
 * -1 when the timer ran out. The caller gives the buffer back with
 * post_rx(head). */
static int net_recv(unsigned char **frame, unsigned int *frame_len, int *head)
{
	unsigned int len;
	int h;

	for (;;) {
		__asm__ volatile("cli" ::: "memory");
		h = vq_poll(&net_q[0], &len);
		if (h >= 0)
			break;
		if (!irq_timer_left())
			return -1;
		/* sti takes effect after hlt starts: an interrupt in between
		 * wakes the hlt instead of being lost. */
		__asm__ volatile("sti; hlt" ::: "memory");
	}
	*head = h;
	if (h >= NRX || len < NET_HDR + 14 || len > RX_SIZE) {
		*frame_len = 0;
		*frame = 0;
		return 0;
	}
	*frame = net_rx[h] + NET_HDR;
	*frame_len = len - NET_HDR;
	return 0;
}

static int learn_gateway(void)
{
	static const unsigned char bcast[6] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	unsigned char *f = net_tx + NET_HDR, *r;
	unsigned int n, len;
	int i, head;

	eth_header(f, bcast, 0x0806);
	be16(f + 14, 1);      /* Ethernet */
	be16(f + 16, 0x0800); /* IPv4 */
	f[18] = 6;
	f[19] = 4;
	be16(f + 20, 1);      /* request */
	for (i = 0; i < 6; i++) {
		f[22 + i] = my_mac[i];
		f[32 + i] = 0;
	}
	be32(f + 28, my_ip);
	be32(f + 38, gw_ip);
	net_send(42);
	for (n = 0; n < MAX_FRAMES; n++) {
		if (net_recv(&r, &len, &head))
			return -1;
		if (r && len >= 42 && rd16(r + 12) == 0x0806 && rd16(r + 20) == 2 &&
		    rd32(r + 28) == gw_ip) {
			for (i = 0; i < 6; i++)
				gw_mac[i] = r[22 + i];
			post_rx((unsigned short)head);
			return 0;
		}
		if (head < NRX)
			post_rx((unsigned short)head);
	}
	return -1;
}

/* An IPv4 + TCP segment (no options) to ip:port with `flags` and `n`
 * bytes of `data` (at most MAX_PAYLOAD). */
static void send_segment(unsigned int ip, unsigned int sport, unsigned int dport,
			 unsigned int seq, unsigned int ack, unsigned int flags,
			 const char *data, unsigned int n)
{
	unsigned char *f = net_tx + NET_HDR, *ipv4 = f + 14, *tcp = f + 34;
	unsigned int i, sum;

	if (n > MAX_PAYLOAD)
		n = MAX_PAYLOAD;
	eth_header(f, gw_mac, 0x0800);
	for (i = 0; i < 40; i++)
		ipv4[i] = 0;
	for (i = 0; i < n; i++)
		tcp[20 + i] = (unsigned char)data[i];
	ipv4[0] = 0x45;
	be16(ipv4 + 2, 40 + n);
	be16(ipv4 + 4, syn_count & 0xffff);
	be16(ipv4 + 6, 0x4000); /* don't fragment */
	ipv4[8] = 64;
	ipv4[9] = 6;
	be32(ipv4 + 12, my_ip);
	be32(ipv4 + 16, ip);
	be16(ipv4 + 10, fold(sum16(ipv4, 20, 0)));
	be16(tcp, sport);
	be16(tcp + 2, dport);
	be32(tcp + 4, seq);
	be32(tcp + 8, ack);
	tcp[12] = 5 << 4;
	tcp[13] = (unsigned char)flags;
	be16(tcp + 14, 0xffff);
	/* Pseudo-header: addresses, protocol, TCP length. */
	sum = sum16(ipv4 + 12, 8, 0) + 6 + 20 + n;
	be16(tcp + 16, fold(sum16(tcp, 20 + n, sum)));
	net_send(54 + n);
}

/* A 40-byte IPv4 + TCP segment (no options) to ip:port with `flags`. */
static void send_tcp(unsigned int ip, unsigned int sport, unsigned int dport,
		     unsigned int seq, unsigned int ack, unsigned int flags)
{
	send_segment(ip, sport, dport, seq, ack, flags, 0, 0);
}

/* Starts a connection: a fresh source port and ISN, the gateway's MAC
 * learned once, the SYN sent, and the wait timer running. Returns -1 once
 * the SYN is out, or the NET_ result that ends the attempt (the timer is
 * stopped then). */
static int send_syn(unsigned int ip, unsigned int port, unsigned int *sport, unsigned int *isn)
{
	if (!net_up)
		return NET_NO_DEVICE;
	syn_count++;
	*sport = 49152 + (syn_count & 0x3fff);
	*isn = 0x5a000000u + syn_count * 0x10000u;
	irq_timer_start(WAIT_CYCLES);
	if (!gw_known) {
		if (learn_gateway()) {
			irq_timer_stop();
			return NET_NO_ARP;
		}
		gw_known = 1;
	}
	send_tcp(ip, *sport, port, *isn, 0, 0x02);
	return -1;
}

int net_syn(unsigned int ip, unsigned int port)
{
	unsigned int sport, isn, n, len, flags;
	unsigned char *r;
	int head, started, result = NET_NO_ANSWER;

	started = send_syn(ip, port, &sport, &isn);
	if (started >= 0)
		return started;
	for (n = 0; n < MAX_FRAMES; n++) {
		if (net_recv(&r, &len, &head))
			break;
		if (r && len >= 54 && rd16(r + 12) == 0x0800 && (r[14] >> 4) == 4 &&
		    r[23] == 6 && rd32(r + 26) == ip) {
			unsigned char *tcp = r + 14 + 4 * (r[14] & 0xf);

			if (tcp + 20 <= r + len && rd16(tcp) == port && rd16(tcp + 2) == sport) {
				flags = tcp[13];
				if ((flags & 0x12) == 0x12 && rd32(tcp + 8) == isn + 1) {
					post_rx((unsigned short)head);
					send_tcp(ip, sport, port, isn + 1, 0, 0x04);
					result = NET_SYNACK;
					break;
				}
				if (flags & 0x04) {
					result = NET_RST;
					post_rx((unsigned short)head);
					break;
				}
			}
		}
		if (head < NRX)
			post_rx((unsigned short)head);
	}
	irq_timer_stop();
	return result;
}

int net_connect(unsigned int ip, unsigned int port)
{
	unsigned int sport, isn, n, len, flags, peer, hdr, ip_len, data;
	unsigned char *r;
	int head, started, done, open = 0, result = NET_NO_ANSWER;

	started = send_syn(ip, port, &sport, &isn);
	if (started >= 0)
		return started;
	for (n = 0; n < MAX_FRAMES; n++) {
		if (net_recv(&r, &len, &head))
			break;
		done = 0;
		if (r && len >= 54 && rd16(r + 12) == 0x0800 && (r[14] >> 4) == 4 &&
		    r[23] == 6 && rd32(r + 26) == ip) {
			unsigned char *tcp = r + 14 + 4 * (r[14] & 0xf);

			if (tcp + 20 <= r + len && rd16(tcp) == port && rd16(tcp + 2) == sport) {
				flags = tcp[13];
				ip_len = rd16(r + 16);
				hdr = 4 * (r[14] & 0xf) + 4 * (tcp[12] >> 4);
				data = ip_len > hdr ? ip_len - hdr : 0;
				if (flags & 0x04) {
					result = NET_RST;
					open = 0;
					done = 1;
				} else if (!open && (flags & 0x12) == 0x12 &&
					   rd32(tcp + 8) == isn + 1) {
					/* ACK the SYN-ACK: the peer's accept() returns. */
					peer = rd32(tcp + 4) + 1;
					send_tcp(ip, sport, port, isn + 1, peer, 0x10);
					open = 1;
					result = NET_SYNACK;
				} else if (open && data) {
					result = NET_DATA;
					done = 1;
				} else if (open && (flags & 0x01)) {
					result = NET_FIN;
					done = 1;
				}
			}
		}
		if (head < NRX)
			post_rx((unsigned short)head);
		if (done)
			break;
	}
	/* Leave nothing half-open on either side. */
	if (open || result == NET_FIN || result == NET_DATA)
		send_tcp(ip, sport, port, isn + 1, 0, 0x04);
	irq_timer_stop();
	return result;
}

int net_serve(unsigned int port, const char *reply, unsigned int reply_len)
{
	unsigned int n, len, flags, hdr, ip_len, data, isn, peer_ip = 0, peer_port = 0, peer_seq = 0;
	unsigned char *r;
	int head, done, state = SERVE_LISTEN, result = NET_NO_ANSWER;

	if (!net_up)
		return NET_NO_DEVICE;
	if (reply_len > MAX_PAYLOAD)
		return NET_NO_ANSWER;
	syn_count++;
	isn = 0x6b000000u + syn_count * 0x10000u;
	irq_timer_start(SERVE_CYCLES);
	for (n = 0; n < SERVE_FRAMES; n++) {
		if (net_recv(&r, &len, &head))
			break;
		done = 0;
		if (r && len >= 54 && rd16(r + 12) == 0x0800 && (r[14] >> 4) == 4 &&
		    r[23] == 6 && rd32(r + 30) == my_ip) {
			unsigned char *tcp = r + 14 + 4 * (r[14] & 0xf);
			unsigned int ip = rd32(r + 26);

			if (tcp + 20 <= r + len && rd16(tcp + 2) == port) {
				unsigned int sport = rd16(tcp);
				int ours = state != SERVE_LISTEN && ip == peer_ip && sport == peer_port;

				flags = tcp[13];
				ip_len = rd16(r + 16);
				hdr = 4 * (r[14] & 0xf) + 4 * (tcp[12] >> 4);
				data = ip_len > hdr ? ip_len - hdr : 0;
				if ((flags & 0x12) == 0x02 && (state == SERVE_LISTEN || ours)) {
					/* A SYN, or its retransmission: SYN-ACK, to the
					 * MAC it came from (the tap's: no ARP, which
					 * would drop the frames that arrive meanwhile). */
					int i;

					for (i = 0; i < 6; i++)
						gw_mac[i] = r[6 + i];
					gw_known = 1;
					peer_ip = ip;
					peer_port = sport;
					peer_seq = rd32(tcp + 4) + 1;
					send_tcp(peer_ip, port, peer_port, isn, peer_seq, 0x12);
					state = SERVE_OPEN;
				} else if (ours && (flags & 0x04)) {
					done = 1;
				} else if (ours && state == SERVE_OPEN && data) {
					/* The request: the reply and FIN in one segment. */
					peer_seq = rd32(tcp + 4) + data;
					send_segment(peer_ip, port, peer_port, isn + 1, peer_seq, 0x19,
						     reply, reply_len);
					state = SERVE_REPLIED;
					result = NET_DATA;
				} else if (ours && state == SERVE_REPLIED && (flags & 0x01)) {
					/* The peer's FIN after our reply: ACK it, done. */
					peer_seq = rd32(tcp + 4) + data + 1;
					send_tcp(peer_ip, port, peer_port, isn + 2 + reply_len, peer_seq,
						 0x10);
					done = 1;
				}
			}
		}
		if (head < NRX)
			post_rx((unsigned short)head);
		if (done)
			break;
	}
	irq_timer_stop();
	return result;
}
