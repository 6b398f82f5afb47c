/*
 * The test guest's device work, done only when the boot-info block lists
 * virtio devices:
 *
 * Block, for each disk N in boot-info order (serial lines the tests match):
 *   guest: blkN sectors=S ro=0|1 id=ID read=ST sum=0xSUM head=HEX16
 *     (sector 0 read: status, byte sum, first 8 bytes)
 *   read-only disk:  guest: blkN write status=ST   (a refused write: 1)
 *   writable disk:   guest: blkN write status=ST flush=ST readback=ok|BAD
 *     (sector 1 gets byte i = i * 7 + 3, then is read back)
 *
 * vsock: listens on port 1024 and echoes what each connection sends; a
 * packet starting with "quit" ends the guest through the exit port, one
 * starting with "count" increments a counter in guest memory and is answered
 * "count=N" instead of an echo (snapshot tests: the counter must continue
 * after a restore). Other ports get RST. Up to 4 connections at once. A
 * TRANSPORT_RESET event (the VMM was restored from a snapshot) drops every
 * connection and the guest keeps listening ("guest: vsock reset").
 *
 * It also connects to the host on AGENT_HOST_PORT and serves the agent
 * protocol there (agent.c); a host with nothing listening there refuses,
 * and the guest carries on without. After a TRANSPORT_RESET it dials again,
 * so a restored guest's agent reaches its new host. While nothing arrives
 * the guest halts until the device's interrupt (irq.c).
 *
 * Everything is synchronous and polled, a few hundred instructions per
 * request: under kvm_pvm every guest instruction may be emulated.
 */
#include "guest.h"
#include "virtio.h"

#define BLK_T_IN 0u
#define BLK_T_OUT 1u
#define BLK_T_FLUSH 4u
#define BLK_T_GET_ID 8u
#define BLK_F_RO 5

struct blk_req {
	unsigned int type;
	unsigned int reserved;
	unsigned long sector;
};

static struct vq blk_qs[BOOT_INFO_MAX_VIRTIO];
static struct blk_req blk_hdr;
static unsigned char blk_buf[512] __attribute__((aligned(16)));
static unsigned char blk_out[512] __attribute__((aligned(16)));
static unsigned char blk_id[21];
static volatile unsigned char blk_status;
static int blk_count;

/* One request: header, optional data, status. Returns the status byte. */
static unsigned int blk_do(struct vq *q, unsigned int type, unsigned long sector,
			   void *data, unsigned int len, int device_writes)
{
	unsigned int used_len;

	blk_hdr.type = type;
	blk_hdr.reserved = 0;
	blk_hdr.sector = sector;
	blk_status = 0xff;
	q->desc[0].addr = (unsigned long)&blk_hdr;
	q->desc[0].len = sizeof(blk_hdr);
	q->desc[0].flags = VRING_DESC_F_NEXT;
	q->desc[0].next = len ? 1 : 2;
	q->desc[1].addr = (unsigned long)data;
	q->desc[1].len = len;
	q->desc[1].flags = VRING_DESC_F_NEXT | (device_writes ? VRING_DESC_F_WRITE : 0);
	q->desc[1].next = 2;
	q->desc[2].addr = (unsigned long)&blk_status;
	q->desc[2].len = 1;
	q->desc[2].flags = VRING_DESC_F_WRITE;
	q->desc[2].next = 0;
	vq_submit(q, 0);
	vq_wait(q, &used_len);
	return blk_status;
}

static void put_bytes_hex(const unsigned char *b, int n)
{
	static const char digits[] = "0123456789abcdef";
	int i;

	for (i = 0; i < n; i++) {
		put_char(digits[b[i] >> 4]);
		put_char(digits[b[i] & 0xf]);
	}
}

static void block_check(int n, const struct boot_virtio *d, struct vq *q)
{
	unsigned int features, ro, st, sum = 0, i;
	unsigned long sectors;

	put_str("guest: blk");
	put_dec((unsigned long)n);
	if (virtio_init(d->base, VIRTIO_ID_BLOCK, q, 1, &features)) {
		put_str(" init FAIL\n");
		return;
	}
	ro = (features >> BLK_F_RO) & 1;
	sectors = virtio_config32(d->base, 0) |
		  ((unsigned long)virtio_config32(d->base, 4) << 32);
	for (i = 0; i < sizeof(blk_id); i++)
		blk_id[i] = 0;
	blk_do(q, BLK_T_GET_ID, 0, blk_id, 20, 1);
	st = blk_do(q, BLK_T_IN, 0, blk_buf, 512, 1);
	for (i = 0; i < 512; i++)
		sum += blk_buf[i];
	put_str(" sectors=");
	put_dec(sectors);
	put_str(ro ? " ro=1 id=" : " ro=0 id=");
	put_str((const char *)blk_id);
	put_str(" read=");
	put_dec(st);
	put_str(" sum=");
	put_hex(sum);
	put_str(" head=");
	put_bytes_hex(blk_buf, 8);
	put_char('\n');

	for (i = 0; i < 512; i++)
		blk_out[i] = (unsigned char)(i * 7 + 3);
	put_str("guest: blk");
	put_dec((unsigned long)n);
	if (ro) {
		/* The driver was told the disk is read-only and writes anyway:
		 * the VMM must refuse. */
		st = blk_do(q, BLK_T_OUT, 0, blk_out, 512, 0);
		put_str(" write status=");
		put_dec(st);
		put_char('\n');
		return;
	}
	st = blk_do(q, BLK_T_OUT, 1, blk_out, 512, 0);
	put_str(" write status=");
	put_dec(st);
	st = blk_do(q, BLK_T_FLUSH, 0, 0, 0, 0);
	put_str(" flush=");
	put_dec(st);
	st = blk_do(q, BLK_T_IN, 1, blk_buf, 512, 1);
	for (i = 0; i < 512 && blk_buf[i] == blk_out[i]; i++)
		;
	put_str(st == 0 && i == 512 ? " readback=ok\n" : " readback=BAD\n");
}

void run_block_checks(const struct boot_info *bi)
{
	unsigned int i;
	int n = 0;

	for (i = 0; i < bi->virtio_count && i < BOOT_INFO_MAX_VIRTIO; i++)
		if (bi->virtio[i].device_type == VIRTIO_ID_BLOCK) {
			block_check(n, &bi->virtio[i], &blk_qs[n]);
			n++;
		}
	blk_count = n;
}

unsigned int guest_blk_sector(int n, unsigned long sector, unsigned char *buf, int write)
{
	unsigned int st;

	if (n < 0 || n >= blk_count)
		return 0xff;
	if (!write)
		return blk_do(&blk_qs[n], BLK_T_IN, sector, buf, 512, 1);
	st = blk_do(&blk_qs[n], BLK_T_OUT, sector, buf, 512, 0);
	return st ? st : blk_do(&blk_qs[n], BLK_T_FLUSH, 0, 0, 0, 0);
}

/* ---- vsock ---- */

#define VSOCK_HOST_CID 2ul
#define VSOCK_TYPE_STREAM 1
#define OP_REQUEST 1
#define OP_RESPONSE 2
#define OP_RST 3
#define OP_SHUTDOWN 4
#define OP_RW 5
#define OP_CREDIT_UPDATE 6
#define OP_CREDIT_REQUEST 7
#define LISTEN_PORT 1024u
#define GUEST_BUF_ALLOC 65536u
#define NRX 4
#define RX_BUF_SIZE 1024
#define MAX_CONNS 4
/* sandbox_proto::AGENT_VSOCK_PORT, and the guest's own end of that link. */
#define AGENT_HOST_PORT 1025u
#define AGENT_LOCAL_PORT 49152u
#define AGENT_CONNECTING 1
#define AGENT_CONNECTED 2

struct vsock_hdr {
	unsigned long src_cid;
	unsigned long dst_cid;
	unsigned int src_port;
	unsigned int dst_port;
	unsigned int len;
	unsigned short type;
	unsigned short op;
	unsigned int flags;
	unsigned int buf_alloc;
	unsigned int fwd_cnt;
} __attribute__((packed));

struct conn {
	int used;
	unsigned int peer_port;
	unsigned int fwd_cnt;        /* bytes consumed (all of them, at once) */
	unsigned int tx_cnt;         /* bytes sent */
	unsigned int peer_buf_alloc;
	unsigned int peer_fwd_cnt;
};

static struct vq vs_q[3];       /* rx, tx, event */
static unsigned char vs_rx[NRX][RX_BUF_SIZE] __attribute__((aligned(16)));
static struct vsock_hdr vs_tx_hdr;
static unsigned int vs_event;
static struct conn conns[MAX_CONNS];
static unsigned long my_cid;
static struct conn agent_conn;   /* used: 0, AGENT_CONNECTING or AGENT_CONNECTED */
static volatile unsigned long vs_counter;
static char vs_count_reply[32];

/* Sends one packet on the TX queue and waits until the device took it.
 * `data` may point into an RX buffer: it is not recycled before this returns. */
static void vs_send(unsigned short op, unsigned int src_port, unsigned int dst_port,
		    unsigned int flags, struct conn *c, const void *data, unsigned int len)
{
	struct vq *q = &vs_q[1];
	unsigned int used_len;

	vs_tx_hdr.src_cid = my_cid;
	vs_tx_hdr.dst_cid = VSOCK_HOST_CID;
	vs_tx_hdr.src_port = src_port;
	vs_tx_hdr.dst_port = dst_port;
	vs_tx_hdr.len = len;
	vs_tx_hdr.type = VSOCK_TYPE_STREAM;
	vs_tx_hdr.op = op;
	vs_tx_hdr.flags = flags;
	vs_tx_hdr.buf_alloc = GUEST_BUF_ALLOC;
	vs_tx_hdr.fwd_cnt = c ? c->fwd_cnt : 0;
	q->desc[0].addr = (unsigned long)&vs_tx_hdr;
	q->desc[0].len = sizeof(vs_tx_hdr);
	q->desc[0].flags = len ? VRING_DESC_F_NEXT : 0;
	q->desc[0].next = 1;
	q->desc[1].addr = (unsigned long)data;
	q->desc[1].len = len;
	q->desc[1].flags = 0;
	q->desc[1].next = 0;
	vq_submit(q, 0);
	vq_wait(q, &used_len);
	if (c)
		c->tx_cnt += len;
}

static void reply_rst(const struct vsock_hdr *h)
{
	vs_send(OP_RST, h->dst_port, h->src_port, 0, 0, 0, 0);
}

static struct conn *find_conn(unsigned int peer_port)
{
	int i;

	for (i = 0; i < MAX_CONNS; i++)
		if (conns[i].used && conns[i].peer_port == peer_port)
			return &conns[i];
	return 0;
}

static void agent_connect(void)
{
	agent_conn.used = AGENT_CONNECTING;
	agent_conn.peer_port = AGENT_HOST_PORT;
	agent_conn.fwd_cnt = 0;
	agent_conn.tx_cnt = 0;
	agent_conn.peer_buf_alloc = 0;
	agent_conn.peer_fwd_cnt = 0;
	vs_send(OP_REQUEST, AGENT_LOCAL_PORT, AGENT_HOST_PORT, 0, &agent_conn, 0, 0);
}

void agent_link_send(const void *data, unsigned int len)
{
	if (agent_conn.used == AGENT_CONNECTED)
		vs_send(OP_RW, AGENT_LOCAL_PORT, AGENT_HOST_PORT, 0, &agent_conn, data, len);
}

/* The control packets every connection answers alike: a credit request, the
 * host's shutdown (finished the way Linux does: with RST) and its reset. */
static void conn_control(struct conn *c, unsigned int local_port, unsigned short op)
{
	switch (op) {
	case OP_CREDIT_REQUEST:
		vs_send(OP_CREDIT_UPDATE, local_port, c->peer_port, 0, c, 0, 0);
		break;
	case OP_SHUTDOWN:
		vs_send(OP_RST, local_port, c->peer_port, 0, c, 0, 0);
		c->used = 0;
		break;
	case OP_RST:
		c->used = 0;
		break;
	default:
		break;
	}
}

static void agent_packet(const struct vsock_hdr *h, const unsigned char *data,
			 unsigned int len)
{
	struct conn *c = &agent_conn;

	if (!c->used || h->src_port != AGENT_HOST_PORT) {
		if (h->op != OP_RST)
			reply_rst(h);
		return;
	}
	c->peer_buf_alloc = h->buf_alloc;
	c->peer_fwd_cnt = h->fwd_cnt;
	switch (h->op) {
	case OP_RESPONSE:
		if (c->used == AGENT_CONNECTING) {
			c->used = AGENT_CONNECTED;
			agent_connected();
		}
		break;
	case OP_RW:
		/* agent.c copies the bytes out at once, so they count as
		 * forwarded; it bounds a frame well below GUEST_BUF_ALLOC. */
		c->fwd_cnt += len;
		if (c->used != AGENT_CONNECTED || agent_data(data, len)) {
			vs_send(OP_RST, AGENT_LOCAL_PORT, AGENT_HOST_PORT, 0, c, 0, 0);
			c->used = 0;
		}
		break;
	default:
		conn_control(c, AGENT_LOCAL_PORT, h->op);
		break;
	}
}

/* A "count" message: bumps the counter and points data/len at the reply
 * ("count=N"). Returns 0 and leaves them alone for any other message. */
static int count_message(const unsigned char **data, unsigned int *len)
{
	char digits[20];
	unsigned long v;
	unsigned int n = 0, i = 0;
	const char *prefix = "count=";

	if (*len < 5 || (*data)[0] != 'c' || (*data)[1] != 'o' || (*data)[2] != 'u' ||
	    (*data)[3] != 'n' || (*data)[4] != 't')
		return 0;
	v = ++vs_counter;
	while (prefix[i]) {
		vs_count_reply[i] = prefix[i];
		i++;
	}
	do {
		digits[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n)
		vs_count_reply[i++] = digits[--n];
	*data = (const unsigned char *)vs_count_reply;
	*len = i;
	return 1;
}

/* The event queue: TRANSPORT_RESET (the only event) means every connection
 * is gone, e.g. after the VMM restored this guest from a snapshot. */
static void poll_vsock_events(void)
{
	unsigned int len;
	int i;

	if (vq_poll(&vs_q[2], &len) < 0)
		return;
	for (i = 0; i < MAX_CONNS; i++)
		conns[i].used = 0;
	put_str("guest: vsock reset\n");
	vq_submit(&vs_q[2], 0);
	if (agent_conn.used) {
		agent_conn.used = 0;
		agent_connect();
	}
}

static void handle_packet(const struct vsock_hdr *h, const unsigned char *data,
			  unsigned int len)
{
	struct conn *c;
	int i;

	if (h->type != VSOCK_TYPE_STREAM || h->dst_cid != my_cid ||
	    h->src_cid != VSOCK_HOST_CID)
		return;
	if (h->dst_port == AGENT_LOCAL_PORT) {
		agent_packet(h, data, len);
		return;
	}
	if (h->dst_port != LISTEN_PORT) {
		if (h->op != OP_RST)
			reply_rst(h);
		return;
	}
	c = find_conn(h->src_port);
	if (h->op == OP_REQUEST) {
		if (c)
			c->used = 0;
		for (i = 0; i < MAX_CONNS && conns[i].used; i++)
			;
		if (i == MAX_CONNS) {
			reply_rst(h);
			return;
		}
		c = &conns[i];
		c->used = 1;
		c->peer_port = h->src_port;
		c->fwd_cnt = 0;
		c->tx_cnt = 0;
		c->peer_buf_alloc = h->buf_alloc;
		c->peer_fwd_cnt = h->fwd_cnt;
		vs_send(OP_RESPONSE, LISTEN_PORT, c->peer_port, 0, c, 0, 0);
		return;
	}
	if (!c) {
		if (h->op != OP_RST)
			reply_rst(h);
		return;
	}
	c->peer_buf_alloc = h->buf_alloc;
	c->peer_fwd_cnt = h->fwd_cnt;
	switch (h->op) {
	case OP_RW:
		c->fwd_cnt += len;
		if (len >= 4 && data[0] == 'q' && data[1] == 'u' && data[2] == 'i' &&
		    data[3] == 't') {
			put_str("guest: vsock quit\n");
			guest_exit(0);
		}
		count_message(&data, &len);
		/* Echo only within the host's credit; a host that grants too
		 * little for an echo gets its connection reset. */
		if (len > c->peer_buf_alloc - (c->tx_cnt - c->peer_fwd_cnt)) {
			vs_send(OP_RST, LISTEN_PORT, c->peer_port, 0, c, 0, 0);
			c->used = 0;
			return;
		}
		vs_send(OP_RW, LISTEN_PORT, c->peer_port, 0, c, data, len);
		break;
	default:
		conn_control(c, LISTEN_PORT, h->op);
		break;
	}
}

/* The next RX buffer the device filled, handling reset events meanwhile;
 * halts while there is neither (a device interrupt ends the halt). */
static int vs_wait_rx(unsigned int *len)
{
	int head;

	for (;;) {
		__asm__ volatile("cli" ::: "memory");
		poll_vsock_events();
		head = vq_poll(&vs_q[0], len);
		if (head >= 0) {
			/* A reset the device posted before this packet is
			 * seen first. */
			poll_vsock_events();
			return head;
		}
		/* sti takes effect after hlt starts: an interrupt that arrived
		 * since the polls wakes the hlt instead of being lost. */
		__asm__ volatile("sti; hlt" ::: "memory");
	}
}

void serve_vsock(const struct boot_info *bi)
{
	const struct boot_virtio *d = 0;
	unsigned int i, features, len;
	int head;

	for (i = 0; i < bi->virtio_count && i < BOOT_INFO_MAX_VIRTIO; i++)
		if (bi->virtio[i].device_type == VIRTIO_ID_VSOCK)
			d = &bi->virtio[i];
	if (!d)
		return;
	if (virtio_init(d->base, VIRTIO_ID_VSOCK, vs_q, 3, &features)) {
		put_str("guest: vsock init FAIL\n");
		return;
	}
	my_cid = virtio_config32(d->base, 0) |
		 ((unsigned long)virtio_config32(d->base, 4) << 32);
	vs_q[2].desc[0].addr = (unsigned long)&vs_event;
	vs_q[2].desc[0].len = sizeof(vs_event);
	vs_q[2].desc[0].flags = VRING_DESC_F_WRITE;
	vs_q[2].desc[0].next = 0;
	vq_submit(&vs_q[2], 0);
	for (i = 0; i < NRX; i++) {
		vs_q[0].desc[i].addr = (unsigned long)vs_rx[i];
		vs_q[0].desc[i].len = RX_BUF_SIZE;
		vs_q[0].desc[i].flags = VRING_DESC_F_WRITE;
		vs_q[0].desc[i].next = 0;
		vq_submit(&vs_q[0], (unsigned short)i);
	}
	put_str("guest: vsock cid=");
	put_dec(my_cid);
	put_str(" listening port=1024\n");
	irq_route(d->gsi);
	agent_init(bi);
	agent_connect();
	for (;;) {
		const struct vsock_hdr *h;
		unsigned int data_len;

		head = vs_wait_rx(&len);
		if (head >= 0 && head < NRX && len >= sizeof(*h)) {
			h = (const struct vsock_hdr *)vs_rx[head];
			data_len = len - (unsigned int)sizeof(*h);
			if (h->len < data_len)
				data_len = h->len;
			handle_packet(h, vs_rx[head] + sizeof(*h), data_len);
		}
		if (head >= 0 && head < NRX)
			vq_submit(&vs_q[0], (unsigned short)head);
	}
}
