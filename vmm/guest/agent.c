/*
 * The test guest's agent: the subset of sandboxd's agent protocol
 * (proto/src/lib.rs) that lets the daemon drive a microVM end to end with
 * no special case for this guest. The guest connects to the host on vsock
 * port AGENT_VSOCK_PORT (devices.c), says Hello, and answers:
 *
 *   Health               -> Health { version }
 *   Spawn { proc, argv } -> Spawned { pid }, then Output and Exit for the
 *                           built-in program argv[0] (below); an unknown
 *                           program is a NotFound error, as for a container
 *   Signal, WriteStdin, CloseStdin
 *                        -> UnknownProcess (built-ins end at once)
 *   Reseed { seed, time } -> Ok, keeping the seed (a fork's fresh entropy;
 *                           this guest has no RNG to feed)
 *   anything else        -> Error { Other, "not in the test guest" }
 *
 * Built-in programs:
 *   echo ARGS...                 ARGS joined by spaces, and a newline
 *   vcpus                        the vCPU count the VMM gave
 *   mem                          guest RAM in MiB, after checking its last byte
 *   count                        increments a counter in guest memory
 *   seed                         hex of the first 16 bytes of the last Reseed
 *   disk-read D S [OFF [LEN]]    hex of LEN (16) bytes at OFF of sector S of disk D
 *   disk-write D S TEXT          writes TEXT at the start of sector S, flushes
 *   exit N                       exits with code N
 *   net-syn A.B.C.D PORT         a TCP SYN through the net device (net.c):
 *                                `synack from A.B.C.D:PORT` (exit 0), `rst from
 *                                A.B.C.D:PORT` or `no answer` (exit 1)
 *   net-connect A.B.C.D PORT     a whole TCP handshake, then how the peer goes
 *                                on: `closed by A.B.C.D:PORT` (a FIN before any
 *                                byte), `data from ...`, `open to ...` (exit
 *                                0); `rst from ...` or `no answer` (exit 1)
 *
 * The codec is postcard as serde derives it for the Rust types: unsigned
 * integers as LEB128 varints, signed ones zigzag-encoded first, enums as a
 * varint variant index, Option as a 0/1 byte, bool and u8 as one byte, Vec
 * and String as a varint length and the elements. Frames are a u32 LE length
 * and the payload. proto/tests/reference_frames.rs pins the byte sequences
 * this file writes and reads, so a change to the Rust types that would break
 * this guest fails there.
 */
#include "guest.h"

#define PROTOCOL_VERSION 2u
#define MAX_ARGS 8
#define MAX_IN (64 * 1024 + 1024)
#define MAX_FRAME_IN (60 * 1024u)
#define OUT_SIZE 2048
#define TEXT_SIZE 512

/* Variant indexes, in the order the Rust enums declare them. */
enum { REQ_HEALTH = 0, REQ_SPAWN = 1, REQ_WRITE_STDIN = 2, REQ_CLOSE_STDIN = 3,
       REQ_SIGNAL = 4, REQ_RESEED = 15 };
enum { MSG_HELLO = 0, MSG_REPLY = 1, MSG_OUTPUT = 2, MSG_EXIT = 3 };
enum { REPLY_OK = 0, REPLY_HEALTH = 1, REPLY_SPAWNED = 2, REPLY_ERROR = 7 };
enum { KIND_NOT_FOUND = 0, KIND_INVALID_INPUT = 3, KIND_UNKNOWN_PROCESS = 8,
       KIND_OTHER = 10 };
enum { STREAM_STDOUT = 0, STREAM_STDERR = 1 };

struct str {
	const unsigned char *p;
	unsigned long n;
};

struct reader {
	const unsigned char *p, *end;
	int bad;
};

static const struct boot_info *agent_bi;
static unsigned char in_buf[MAX_IN];
static unsigned long in_len;
static unsigned char out[OUT_SIZE];
static unsigned long out_len;
static char text[TEXT_SIZE];
static unsigned long text_len;
static unsigned char sector_buf[512] __attribute__((aligned(16)));
static unsigned long counter;
static unsigned char seed[16];
static unsigned long seed_len;

/* ---- decoding ---- */

static unsigned long rd_varint(struct reader *r)
{
	unsigned long v = 0;
	int shift;

	for (shift = 0; shift < 64 && r->p < r->end; shift += 7) {
		unsigned char b = *r->p++;

		v |= (unsigned long)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return v;
	}
	r->bad = 1;
	return 0;
}

static struct str rd_str(struct reader *r)
{
	struct str s = { 0, 0 };

	s.n = rd_varint(r);
	if (r->bad || s.n > (unsigned long)(r->end - r->p)) {
		r->bad = 1;
		s.n = 0;
		return s;
	}
	s.p = r->p;
	r->p += s.n;
	return s;
}

/* ---- encoding: frames are built in `out`, then sent together ---- */

static void put_u8(unsigned char b)
{
	if (out_len < OUT_SIZE)
		out[out_len++] = b;
}

static void put_varint(unsigned long v)
{
	while (v >= 0x80) {
		put_u8((unsigned char)(v | 0x80));
		v >>= 7;
	}
	put_u8((unsigned char)v);
}

static void put_zigzag(long v)
{
	put_varint(((unsigned long)v << 1) ^ (unsigned long)(v >> 63));
}

static void put_bytes(const void *data, unsigned long n)
{
	const unsigned char *b = data;
	unsigned long i;

	put_varint(n);
	for (i = 0; i < n; i++)
		put_u8(b[i]);
}

static unsigned long frame_start;

static void frame_begin(void)
{
	frame_start = out_len;
	out_len += 4;
}

static void frame_end(void)
{
	unsigned long n = out_len - frame_start - 4;

	if (out_len > OUT_SIZE)
		return;
	out[frame_start] = (unsigned char)n;
	out[frame_start + 1] = (unsigned char)(n >> 8);
	out[frame_start + 2] = (unsigned char)(n >> 16);
	out[frame_start + 3] = (unsigned char)(n >> 24);
}

static void flush_out(void)
{
	if (out_len <= OUT_SIZE)
		agent_link_send(out, (unsigned int)out_len);
	out_len = 0;
}

static void reply_begin(unsigned long id, unsigned int variant)
{
	frame_begin();
	put_varint(MSG_REPLY);
	put_varint(id);
	put_varint(variant);
}

static void reply_error(unsigned long id, unsigned int kind, const char *message)
{
	unsigned long n = 0;

	while (message[n])
		n++;
	reply_begin(id, REPLY_ERROR);
	put_varint(kind);
	put_bytes(message, n);
	frame_end();
}

/* ---- built-in programs: they write `text` and return an exit code ---- */

static void text_char(char c)
{
	if (text_len < TEXT_SIZE)
		text[text_len++] = c;
}

static void text_str(const char *s)
{
	while (*s)
		text_char(*s++);
}

static void text_dec(unsigned long v)
{
	char buf[20];
	int n = 0;

	do {
		buf[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n)
		text_char(buf[--n]);
}

static int parse_dec(struct str s, unsigned long *v)
{
	unsigned long i;

	*v = 0;
	if (!s.n || s.n > 18)
		return -1;
	for (i = 0; i < s.n; i++) {
		if (s.p[i] < '0' || s.p[i] > '9')
			return -1;
		*v = *v * 10 + (s.p[i] - '0');
	}
	return 0;
}

static int str_is(struct str s, const char *w)
{
	unsigned long i;

	for (i = 0; i < s.n; i++)
		if (!w[i] || w[i] != (char)s.p[i])
			return 0;
	return w[i] == 0;
}

static int usage(const char *line)
{
	text_str(line);
	return 2;
}

static int run_mem(void)
{
	volatile unsigned char *last = (volatile unsigned char *)(agent_bi->low_ram_end - 1);
	int ok;

	*last = 0x3c;
	ok = *last == 0x3c;
	text_str("mem_mib=");
	text_dec(agent_bi->mem_bytes >> 20);
	text_str(ok ? " top=ok\n" : " top=FAIL\n");
	return ok ? 0 : 1;
}

static int run_disk_read(struct str *argv, int argc)
{
	static const char digits[] = "0123456789abcdef";
	unsigned long disk, sector, off = 0, len = 16, i;
	unsigned int st;

	if (argc < 3 || parse_dec(argv[1], &disk) || parse_dec(argv[2], &sector) ||
	    (argc > 3 && parse_dec(argv[3], &off)) || (argc > 4 && parse_dec(argv[4], &len)) ||
	    off > 512 || len > 512 - off)
		return usage("usage: disk-read DISK SECTOR [OFFSET [LEN]] (within 512 bytes)\n");
	st = guest_blk_sector((int)disk, sector, sector_buf, 0);
	if (st) {
		text_str("disk-read: status ");
		text_dec(st);
		text_char('\n');
		return 1;
	}
	for (i = off; i < off + len; i++) {
		text_char(digits[sector_buf[i] >> 4]);
		text_char(digits[sector_buf[i] & 0xf]);
	}
	text_char('\n');
	return 0;
}

static int run_disk_write(struct str *argv, int argc)
{
	unsigned long disk, sector, i;
	unsigned int st;

	if (argc != 4 || parse_dec(argv[1], &disk) || parse_dec(argv[2], &sector) ||
	    argv[3].n > 512)
		return usage("usage: disk-write DISK SECTOR TEXT (at most 512 bytes)\n");
	for (i = 0; i < 512; i++)
		sector_buf[i] = i < argv[3].n ? argv[3].p[i] : 0;
	st = guest_blk_sector((int)disk, sector, sector_buf, 1);
	text_str("status=");
	text_dec(st);
	text_char('\n');
	return st ? 1 : 0;
}

/* A dotted IPv4 address, in host order; -1 if it is not one. */
static int parse_ip(struct str s, unsigned int *ip)
{
	unsigned long i, part = 0, parts = 0, digits = 0;

	*ip = 0;
	for (i = 0; i <= s.n; i++) {
		if (i == s.n || s.p[i] == '.') {
			if (!digits || part > 255 || parts == 4)
				return -1;
			*ip = (*ip << 8) | (unsigned int)part;
			parts++;
			part = 0;
			digits = 0;
		} else if (s.p[i] >= '0' && s.p[i] <= '9' && digits < 3) {
			part = part * 10 + (s.p[i] - '0');
			digits++;
		} else {
			return -1;
		}
	}
	return parts == 4 ? 0 : -1;
}

/* `WHAT A.B.C.D:PORT` and a newline. */
static void text_peer(const char *what, unsigned int ip, unsigned long port)
{
	text_str(what);
	text_dec(ip >> 24);
	text_char('.');
	text_dec((ip >> 16) & 0xff);
	text_char('.');
	text_dec((ip >> 8) & 0xff);
	text_char('.');
	text_dec(ip & 0xff);
	text_char(':');
	text_dec(port);
	text_char('\n');
}

/* The answers net-syn and net-connect share: no device, no ARP, none. */
static int text_no_answer(int r)
{
	text_str(r == NET_NO_DEVICE ? "no net device\n" :
		 r == NET_NO_ARP ? "no answer from the gateway (ARP)\n" : "no answer\n");
	return 1;
}

static int run_net_syn(struct str *argv, int argc)
{
	unsigned long port;
	unsigned int ip;
	int r;

	if (argc != 3 || parse_ip(argv[1], &ip) || parse_dec(argv[2], &port) || !port ||
	    port > 65535)
		return usage("usage: net-syn A.B.C.D PORT\n");
	r = net_syn(ip, (unsigned int)port);
	if (r == NET_SYNACK || r == NET_RST) {
		text_peer(r == NET_SYNACK ? "synack from " : "rst from ", ip, port);
		return r == NET_SYNACK ? 0 : 1;
	}
	return text_no_answer(r);
}

static int run_net_connect(struct str *argv, int argc)
{
	unsigned long port;
	unsigned int ip;
	int r;

	if (argc != 3 || parse_ip(argv[1], &ip) || parse_dec(argv[2], &port) || !port ||
	    port > 65535)
		return usage("usage: net-connect A.B.C.D PORT\n");
	r = net_connect(ip, (unsigned int)port);
	switch (r) {
	case NET_FIN:
		text_peer("closed by ", ip, port);
		return 0;
	case NET_DATA:
		text_peer("data from ", ip, port);
		return 0;
	case NET_SYNACK:
		text_peer("open to ", ip, port);
		return 0;
	case NET_RST:
		text_peer("rst from ", ip, port);
		return 1;
	default:
		return text_no_answer(r);
	}
}

/* What `net-serve` answers: an HTTP response any client reads to its end. */
static const char served[] = "HTTP/1.0 200 OK\r\nContent-Length: 20\r\n"
			     "Content-Type: text/plain\r\n\r\nserved by the guest\n";

static int run_net_serve(struct str *argv, int argc)
{
	unsigned long port;
	int r;

	if (argc != 2 || parse_dec(argv[1], &port) || !port || port > 65535)
		return usage("usage: net-serve PORT\n");
	r = net_serve((unsigned int)port, served, sizeof(served) - 1);
	if (r == NET_DATA) {
		text_str("served port ");
		text_dec(port);
		text_char('\n');
		return 0;
	}
	return text_no_answer(r);
}

/* Runs a built-in; returns its exit code, or -1 if there is no such program. */
static int run_builtin(struct str *argv, int argc, int *to_stderr)
{
	unsigned long v;
	int i, code;

	*to_stderr = 0;
	if (str_is(argv[0], "echo")) {
		for (i = 1; i < argc; i++) {
			unsigned long j;

			if (i > 1)
				text_char(' ');
			for (j = 0; j < argv[i].n; j++)
				text_char((char)argv[i].p[j]);
		}
		text_char('\n');
		return 0;
	}
	if (str_is(argv[0], "vcpus")) {
		text_dec(agent_bi->vcpus);
		text_char('\n');
		return 0;
	}
	if (str_is(argv[0], "mem"))
		return run_mem();
	if (str_is(argv[0], "count")) {
		counter++;
		text_str("count=");
		text_dec(counter);
		text_char('\n');
		return 0;
	}
	if (str_is(argv[0], "seed")) {
		static const char digits[] = "0123456789abcdef";

		if (!seed_len)
			text_str("none");
		for (i = 0; i < (int)seed_len; i++) {
			text_char(digits[seed[i] >> 4]);
			text_char(digits[seed[i] & 0xf]);
		}
		text_char('\n');
		return 0;
	}
	if (str_is(argv[0], "exit")) {
		if (argc != 2 || parse_dec(argv[1], &v) || v > 255) {
			*to_stderr = 1;
			return usage("usage: exit N (0-255)\n");
		}
		return (int)v;
	}
	if (str_is(argv[0], "net-syn")) {
		code = run_net_syn(argv, argc);
		*to_stderr = code == 2;
		return code;
	}
	if (str_is(argv[0], "net-connect")) {
		code = run_net_connect(argv, argc);
		*to_stderr = code == 2;
		return code;
	}
	if (str_is(argv[0], "net-serve")) {
		code = run_net_serve(argv, argc);
		*to_stderr = code == 2;
		return code;
	}
	if (str_is(argv[0], "disk-read") || str_is(argv[0], "disk-write")) {
		code = argv[0].n == 9 ? run_disk_read(argv, argc) : run_disk_write(argv, argc);
		*to_stderr = code != 0;
		return code;
	}
	return -1;
}

/* ---- requests ---- */

static void handle_spawn(unsigned long id, struct reader *r)
{
	struct str argv[MAX_ARGS];
	unsigned long proc, argc, i;
	int code, to_stderr;

	proc = rd_varint(r);
	argc = rd_varint(r);
	if (r->bad || argc == 0 || argc > MAX_ARGS) {
		reply_error(id, KIND_INVALID_INPUT, "the test guest takes 1 to 8 arguments");
		return;
	}
	for (i = 0; i < argc; i++)
		argv[i] = rd_str(r);
	/* code, env, cwd, uid, gid, stdin, pty and cgroup_fds follow; the
	 * built-ins need none of them. */
	if (r->bad) {
		reply_error(id, KIND_INVALID_INPUT, "malformed spawn request");
		return;
	}
	text_len = 0;
	code = run_builtin(argv, (int)argc, &to_stderr);
	if (code < 0) {
		reply_error(id, KIND_NOT_FOUND,
			    "no such program in the test guest (it has echo, vcpus, mem, "
			    "count, seed, disk-read, disk-write, net-syn, net-connect, "
			    "net-serve, exit)");
		return;
	}
	reply_begin(id, REPLY_SPAWNED);
	put_zigzag((long)(1000 + proc));
	frame_end();
	if (text_len) {
		frame_begin();
		put_varint(MSG_OUTPUT);
		put_varint(proc);
		put_varint(to_stderr ? STREAM_STDERR : STREAM_STDOUT);
		put_bytes(text, text_len);
		frame_end();
	}
	frame_begin();
	put_varint(MSG_EXIT);
	put_varint(proc);
	put_u8(1); /* code: Some */
	put_zigzag(code);
	put_u8(0); /* signal: None */
	put_u8(0); /* oom_killed: false */
	frame_end();
}

static void handle_request(const unsigned char *payload, unsigned long n)
{
	struct reader r = { payload, payload + n, 0 };
	unsigned long id = rd_varint(&r), body = rd_varint(&r);

	if (r.bad)
		return;
	switch (body) {
	case REQ_HEALTH:
		reply_begin(id, REPLY_HEALTH);
		put_varint(PROTOCOL_VERSION);
		frame_end();
		break;
	case REQ_SPAWN:
		handle_spawn(id, &r);
		break;
	case REQ_RESEED: {
		struct str s = rd_str(&r);
		unsigned long i;

		rd_varint(&r); /* the wall time: this guest keeps none */
		if (r.bad) {
			reply_error(id, KIND_INVALID_INPUT, "malformed reseed request");
			break;
		}
		seed_len = s.n < sizeof(seed) ? s.n : sizeof(seed);
		for (i = 0; i < seed_len; i++)
			seed[i] = s.p[i];
		reply_begin(id, REPLY_OK);
		frame_end();
		break;
	}
	case REQ_WRITE_STDIN:
	case REQ_CLOSE_STDIN:
	case REQ_SIGNAL:
		reply_error(id, KIND_UNKNOWN_PROCESS, "the process has already exited");
		break;
	default:
		reply_error(id, KIND_OTHER, "this request is not in the test guest's agent");
		break;
	}
	flush_out();
}

void agent_init(const struct boot_info *bi)
{
	agent_bi = bi;
}

void agent_connected(void)
{
	in_len = 0;
	frame_begin();
	put_varint(MSG_HELLO);
	put_varint(PROTOCOL_VERSION);
	frame_end();
	flush_out();
}

int agent_data(const unsigned char *data, unsigned int len)
{
	unsigned long i, n;

	if (in_len + len > MAX_IN)
		return -1;
	for (i = 0; i < len; i++)
		in_buf[in_len + i] = data[i];
	in_len += len;
	while (in_len >= 4) {
		n = in_buf[0] | (unsigned long)in_buf[1] << 8 | (unsigned long)in_buf[2] << 16 |
		    (unsigned long)in_buf[3] << 24;
		if (n > MAX_FRAME_IN)
			return -1;
		if (in_len < 4 + n)
			break;
		handle_request(in_buf + 4, n);
		for (i = 0; i + 4 + n < in_len; i++)
			in_buf[i] = in_buf[i + 4 + n];
		in_len -= 4 + n;
	}
	return 0;
}
