/*
 * virtio-mmio transport and split virtqueues for the test guest (see
 * virtio.h). Every register access is a VM exit and every instruction may
 * be emulated, so this does the spec's initialisation steps and nothing else.
 */
#include "virtio.h"

#define REG_MAGIC 0x000
#define REG_VERSION 0x004
#define REG_DEVICE_ID 0x008
#define REG_DEVICE_FEATURES 0x010
#define REG_DEVICE_FEATURES_SEL 0x014
#define REG_DRIVER_FEATURES 0x020
#define REG_DRIVER_FEATURES_SEL 0x024
#define REG_QUEUE_SEL 0x030
#define REG_QUEUE_NUM_MAX 0x034
#define REG_QUEUE_NUM 0x038
#define REG_QUEUE_READY 0x044
#define REG_QUEUE_NOTIFY 0x050
#define REG_STATUS 0x070
#define REG_QUEUE_DESC_LOW 0x080
#define REG_QUEUE_DESC_HIGH 0x084
#define REG_QUEUE_AVAIL_LOW 0x090
#define REG_QUEUE_AVAIL_HIGH 0x094
#define REG_QUEUE_USED_LOW 0x0a0
#define REG_QUEUE_USED_HIGH 0x0a4
#define REG_CONFIG 0x100

#define MMIO_MAGIC 0x74726976u
#define STATUS_ACK 1u
#define STATUS_DRIVER 2u
#define STATUS_DRIVER_OK 4u
#define STATUS_FEATURES_OK 8u

#define barrier() __asm__ volatile("" ::: "memory")

static inline unsigned int rd(unsigned long base, unsigned int off)
{
	return *(volatile unsigned int *)(base + off);
}

static inline void wr(unsigned long base, unsigned int off, unsigned int v)
{
	*(volatile unsigned int *)(base + off) = v;
}

unsigned int virtio_config32(unsigned long base, unsigned int offset)
{
	return rd(base, REG_CONFIG + offset);
}

int virtio_init(unsigned long base, unsigned int type, struct vq *qs, int nq,
		unsigned int *dev_features_lo)
{
	unsigned int s;
	int i;

	if (rd(base, REG_MAGIC) != MMIO_MAGIC || rd(base, REG_VERSION) != 2 ||
	    rd(base, REG_DEVICE_ID) != type)
		return -1;
	wr(base, REG_STATUS, 0);
	wr(base, REG_STATUS, STATUS_ACK);
	wr(base, REG_STATUS, STATUS_ACK | STATUS_DRIVER);
	wr(base, REG_DEVICE_FEATURES_SEL, 0);
	*dev_features_lo = rd(base, REG_DEVICE_FEATURES);
	wr(base, REG_DEVICE_FEATURES_SEL, 1);
	if (!(rd(base, REG_DEVICE_FEATURES) & 1)) /* VIRTIO_F_VERSION_1 */
		return -1;
	wr(base, REG_DRIVER_FEATURES_SEL, 0);
	wr(base, REG_DRIVER_FEATURES, 0);
	wr(base, REG_DRIVER_FEATURES_SEL, 1);
	wr(base, REG_DRIVER_FEATURES, 1);
	s = STATUS_ACK | STATUS_DRIVER | STATUS_FEATURES_OK;
	wr(base, REG_STATUS, s);
	if (!(rd(base, REG_STATUS) & STATUS_FEATURES_OK))
		return -1;
	for (i = 0; i < nq; i++) {
		struct vq *q = &qs[i];
		unsigned long d = (unsigned long)q->desc;
		unsigned long a = (unsigned long)&q->avail;
		unsigned long u = (unsigned long)&q->used;

		wr(base, REG_QUEUE_SEL, (unsigned int)i);
		if (rd(base, REG_QUEUE_NUM_MAX) < VQ_SIZE)
			return -1;
		wr(base, REG_QUEUE_NUM, VQ_SIZE);
		wr(base, REG_QUEUE_DESC_LOW, (unsigned int)d);
		wr(base, REG_QUEUE_DESC_HIGH, (unsigned int)(d >> 32));
		wr(base, REG_QUEUE_AVAIL_LOW, (unsigned int)a);
		wr(base, REG_QUEUE_AVAIL_HIGH, (unsigned int)(a >> 32));
		wr(base, REG_QUEUE_USED_LOW, (unsigned int)u);
		wr(base, REG_QUEUE_USED_HIGH, (unsigned int)(u >> 32));
		wr(base, REG_QUEUE_READY, 1);
		q->notify = base + REG_QUEUE_NOTIFY;
		q->index = (unsigned int)i;
	}
	wr(base, REG_STATUS, s | STATUS_DRIVER_OK);
	return (rd(base, REG_STATUS) & STATUS_DRIVER_OK) ? 0 : -1;
}

void vq_submit(struct vq *q, unsigned short head)
{
	q->avail.ring[q->avail_idx % VQ_SIZE] = head;
	/* x86 keeps stores in order; the compiler must too: the ring entry,
	 * then the index, then the notify. */
	barrier();
	q->avail_idx++;
	*(volatile unsigned short *)&q->avail.idx = q->avail_idx;
	barrier();
	*(volatile unsigned int *)q->notify = q->index;
}

int vq_poll(struct vq *q, unsigned int *len)
{
	struct vring_used_elem e;

	if (*(volatile unsigned short *)&q->used.idx == q->last_used)
		return -1;
	barrier();
	e = *(volatile struct vring_used_elem *)&q->used.ring[q->last_used % VQ_SIZE];
	q->last_used++;
	*len = e.len;
	return (int)e.id;
}

int vq_wait(struct vq *q, unsigned int *len)
{
	int head;

	while ((head = vq_poll(q, len)) < 0)
		__asm__ volatile("pause");
	return head;
}
